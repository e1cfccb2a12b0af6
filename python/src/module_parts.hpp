// The parts of the _core module, one file each; module.cpp registers them in order.
#pragma once

#include <pybind11/pybind11.h>

namespace machina::binding {

namespace py = pybind11;

/// Host, Session (machina::CallerState) and the host's keyword options (host_binding.cpp).
void bind_host(py::module_& m);
/// The raw calls of the hot path: call, encode_request and InProcess.call (fast_calls.cpp).
void bind_fast_calls(py::module_& m);
/// The pool's wire: round_trip, encode_requests, decode_response(s), delta_between (pool_binding.cpp).
void bind_pool(py::module_& m);
/// ChildProcess and run_to_completion (process_binding.cpp).
void bind_processes(py::module_& m);

}  // namespace machina::binding
