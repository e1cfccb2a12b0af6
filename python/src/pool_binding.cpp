// The pool's wire in C++: one pooled call's round trip, request lines for many calls,
// response lines decoded into ToolResults, and the delta between two states.
#include "call_arguments.hpp"
#include "module_parts.hpp"
#include "result_factory.hpp"

#include <machina/ndjson_client.hpp>
#include <machina/request.hpp>
#include <machina/spin_wait.hpp>

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace machina::binding {

using namespace py::literals;

void bind_pool(py::module_& m) {
  m.def(
      "round_trip",
      [](int fd_in, int fd_out, const py::bytes& line, double timeout_s, const py::object& write_lock,
         std::int64_t spin_us, std::int64_t id, const py::object& aid) {
        // The pool's lone caller (machina::round_trip, with the GIL released). `write_lock`
        // (held by the caller) is released as soon as the writing ends. Returns (bytes
        // written, bytes read, status, result): status 0 done, 1 end of output, 2 out of
        // time, 3 the write failed. When what was read is exactly one response line,
        // answering `id`, it comes decoded as `result` (for `aid`) and no bytes are returned;
        // anything else is left to the pool's general reader (result None).
        char* out = nullptr;
        Py_ssize_t out_size = 0;
        if (PyBytes_AsStringAndSize(line.ptr(), &out, &out_size) != 0) throw py::error_already_set();
        machina::RoundTrip rt;
        {
          py::gil_scoped_release release;
          const auto until =
              std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                     std::chrono::duration<double>(std::max(timeout_s, 0.0)));
          rt = machina::round_trip(fd_in, fd_out, std::string_view(out, static_cast<std::size_t>(out_size)), until,
                                   std::chrono::microseconds(spin_us), [&] {
                                     py::gil_scoped_acquire gil;
                                     write_lock.attr("release")();
                                   });
        }
        const int status = static_cast<int>(rt.status);
        const std::string& data = rt.data;
        if (rt.status == machina::RoundTrip::Status::done && id >= 0 && data.size() > 1 &&
            data.find('\n') == data.size() - 1) {
          machina::ResponseFields fields;
          std::string why;
          if (machina::decode_response(std::string_view(data).substr(0, data.size() - 1), fields, why) &&
              fields.id == id) {
            try {
              return py::make_tuple(rt.written, py::bytes(), status, results().make(aid, fields));
            } catch (const py::value_error&) {
              // (an error code this build does not know: the general reader reports it)
            }
          }
        }
        return py::make_tuple(rt.written, py::bytes(data), status, py::object(py::none()));
      },
      "fd_in"_a, "fd_out"_a, "line"_a, "timeout_s"_a, "write_lock"_a, "spin_us"_a = 0, "id"_a = -1,
      "aid"_a = py::none(), "One pooled call's write and first read (see the pool).");
  m.def(
      "encode_requests",
      [](const py::list& calls) {
        // Each item: the arguments of encode_request, as a tuple.
        const RequestLayout& layout = encode_request_layout();
        std::string out;
        out.reserve(calls.size() * 64);
        for (const py::handle item : calls) {
          const py::object items =
              py::reinterpret_steal<py::object>(PySequence_Fast(item.ptr(), "a call must be a tuple"));
          if (!items) throw py::error_already_set();
          const Arguments<RequestArgument> a =
              layout.parse(PySequence_Fast_ITEMS(items.ptr()), PySequence_Fast_GET_SIZE(items.ptr()));
          const long long id = PyLong_AsLongLong(a[RequestArgument::id]);
          if (id == -1 && PyErr_Occurred()) throw py::error_already_set();
          const RequestFields call = request_from(a);
          encode_request(call.request, id, call.ds_state_json.value_or(std::string_view()), out);
        }
        return py::bytes(out);
      },
      "calls"_a, "Request lines for many calls at once.");
  m.def(
      "decode_responses",
      [](const py::bytes& data, std::size_t start, const py::dict& aids) {
        // machina::match_responses over `aids`, which maps each open id to its aid in
        // sending order: [(id, result)], and where the next line starts. ValueError if the
        // stream can no longer be trusted.
        struct Open final : machina::OpenRequests {
          const py::dict& aids;
          explicit Open(const py::dict& a) : aids(a) {}
          bool is_open(std::int64_t id) const override { return aids.contains(py::int_(id)); }
          void oldest_first(const std::function<bool(std::int64_t)>& visit) const override {
            for (const auto& item : aids) {
              if (!visit(item.first.cast<std::int64_t>())) return;
            }
          }
        } open(aids);
        char* buf = nullptr;
        Py_ssize_t size = 0;
        if (PyBytes_AsStringAndSize(data.ptr(), &buf, &size) != 0) throw py::error_already_set();
        py::list out;
        std::size_t next = 0;
        try {
          next =
              machina::match_responses(std::string_view(buf, static_cast<std::size_t>(size)), start, open,
                                       [&](std::int64_t id, const machina::ResponseFields& fields) {
                                         const py::int_ key(id);
                                         out.append(py::make_tuple(key, results().make(py::object(aids[key]), fields)));
                                       });
        } catch (const machina::StreamError& e) {
          throw py::value_error(e.what());
        }
        return py::make_tuple(out, next);
      },
      "data"_a, "start"_a, "aids"_a, "Decodes the complete response lines in data[start:].");
  m.def(
      "decode_response",
      [](const py::bytes& line, const py::str& aid) {
        // One response (as --run writes it) for the call to `aid`. ValueError if unreadable.
        machina::ResponseFields fields;
        std::string why;
        if (!machina::decode_response(std::string_view(line), fields, why)) {
          throw py::value_error("unreadable response: " + why);
        }
        return results().make(aid, fields);
      },
      "line"_a, "aid"_a, "Decodes one response line into a ToolResult.");
  m.def(
      "delta_between",
      [](const std::string& before, const std::string& after) {
        std::string out, why;
        if (!machina::delta_between(before, after, out, why)) throw py::value_error("not a ds_state: " + why);
        return out;
      },
      "before"_a, "after"_a, "The delta from one full state to another, as --serve answers it (\"\" if none).");
}

}  // namespace machina::binding
