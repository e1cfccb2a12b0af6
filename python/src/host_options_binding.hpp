// Host()'s keyword arguments, made from the host's option table (machina/host_options.def):
// each keyword sets one HostOptions member, with the type and range the command line's flag
// has; _core.host_options() and _core.host_option_table() describe them.
#pragma once

#include <machina/host_options.hpp>

#include <pybind11/pybind11.h>

namespace machina::binding {

namespace py = pybind11;

/// The host's options: HostOptions::from_env() with each keyword given (None: left as it is)
/// set. Raises TypeError for an unknown keyword or a value of the wrong type, HostError for a
/// value out of its range or not among its choices.
HostOptions host_options_from_kwargs(const py::kwargs& kwargs);

/// Defines _core.host_options() (the keywords, in the table's order) and
/// _core.host_option_table() (a dict per keyword: name, flag, type, kind, min, max, default,
/// choices, env, group, help).
void bind_host_options(py::module_& m);

}  // namespace machina::binding
