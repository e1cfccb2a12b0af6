// Child processes: machina::ChildProcess, the one supervisor (the pool's --serve hosts,
// the spawn transport's --run hosts), and a child run to completion.
#include "module_parts.hpp"

#include <machina/child_process.hpp>

#include <pybind11/stl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace machina::binding {

using namespace py::literals;

namespace {

machina::ChildSpec child_spec(const std::string& executable, const std::vector<std::string>& argv,
                              const std::optional<std::vector<std::string>>& env, std::size_t tail_bytes) {
  machina::ChildSpec spec;
  spec.executable = executable;
  spec.argv = argv;
  spec.inherit_env = !env.has_value();
  if (env) spec.env = *env;
  spec.tail_bytes = tail_bytes;
  return spec;
}

[[noreturn]] void raise_start_error(const machina::StartError& e, const std::string& executable) {
  errno = e.error;
  PyErr_SetFromErrnoWithFilename(PyExc_OSError, executable.c_str());
  throw py::error_already_set();
}

}  // namespace

void bind_processes(py::module_& m) {
  // Child processes: machina::ChildProcess, the one supervisor (the pool's --serve hosts,
  // the spawn transport's --run hosts). Without `env` a child gets this process's
  // environment as the C library has it (os.environ writes through to it); converting
  // os.environ costs more than the spawn. A child that cannot be started raises OSError
  // (FileNotFoundError, PermissionError, ...) naming the file.
  py::class_<machina::ChildProcess>(m, "ChildProcess",
                                    "A child process with stdin and stdout pipes for the caller, its stderr "
                                    "drained into a bounded tail (see machina_dispatch._process).")
      .def(py::init([](const std::string& executable, const std::vector<std::string>& argv,
                       const std::optional<std::vector<std::string>>& env, std::size_t tail_bytes) {
             machina::ChildSpec spec = child_spec(executable, argv, env, tail_bytes);
             spec.stdio = machina::ChildSpec::Stdio::pipes;
             std::unique_ptr<machina::ChildProcess> child;
             try {
               py::gil_scoped_release release;
               child = std::make_unique<machina::ChildProcess>(spec);
               child->drain_in_background();
             } catch (const machina::StartError& e) {
               raise_start_error(e, executable);
             }
             return child;
           }),
           "executable"_a, "argv"_a, "env"_a = py::none(), "tail_bytes"_a = 4096)
      .def_property_readonly("pid", &machina::ChildProcess::pid)
      .def_property_readonly("input_fd", &machina::ChildProcess::input_fd, "Non-blocking write end of its stdin.")
      .def_property_readonly("stdout_fd", &machina::ChildProcess::stdout_fd, "Non-blocking read end of its stdout.")
      .def_property_readonly("exit_code", &machina::ChildProcess::exit_code,
                             "After end(): its exit status, or -N for signal N.")
      .def("tail", &machina::ChildProcess::tail, "The tail of its stderr.")
      .def("close_input", &machina::ChildProcess::close_input, "End of its input (the descriptor number stays taken).")
      .def("exited", &machina::ChildProcess::exited, "Whether it has exited (not reaped).")
      .def(
          "wait_exit",
          [](const machina::ChildProcess& c, double timeout_s) {
            py::gil_scoped_release release;
            return c.wait_exit(std::chrono::milliseconds(static_cast<std::int64_t>(std::max(0.0, timeout_s) * 1000)));
          },
          "timeout_s"_a, "Waits up to timeout_s for it to exit (not reaping it); whether it has.")
      .def("kill", &machina::ChildProcess::kill, "SIGKILL to its process group and to it.")
      .def(
          "end",
          [](machina::ChildProcess& c, double drain_s) {
            py::gil_scoped_release release;
            return c.end(static_cast<int>(std::max(0.0, drain_s) * 1000));
          },
          "drain_s"_a = 1.0, "Kills its group, reaps it, reads the last of its stderr; returns how it ended.");

  m.def(
      "run_to_completion",
      [](const std::string& executable, const std::vector<std::string>& argv,
         const std::optional<std::vector<std::string>>& env, const py::bytes& input, double timeout_s,
         std::size_t max_stdout, std::size_t tail_bytes) {
        const machina::ChildSpec spec = child_spec(executable, argv, env, tail_bytes);
        const std::string_view in = input;
        machina::ChildOutcome r;
        try {
          py::gil_scoped_release release;
          r = machina::run_to_completion(
              spec, in, std::chrono::milliseconds(static_cast<std::int64_t>(std::max(0.0, timeout_s) * 1000)),
              max_stdout);
        } catch (const machina::StartError& e) {
          raise_start_error(e, executable);
        }
        static const char* const names[] = {"exited", "timed_out", "output_over_cap"};
        return py::make_tuple(names[static_cast<int>(r.ended)], py::bytes(r.stdout_text), r.exit_code, r.how, r.tail);
      },
      "executable"_a, "argv"_a, "env"_a, "input"_a, "timeout_s"_a, "max_stdout"_a, "tail_bytes"_a = 4096,
      "Runs a child to completion (machina::run_to_completion): returns (ended, stdout, exit_code, how, "
      "stderr_tail), ended being 'exited', 'timed_out' or 'output_over_cap'.");
}

}  // namespace machina::binding
