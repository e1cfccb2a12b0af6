// Exceptions in the fully static machina-toolhost.
//
// In a static program, GCC's start-up code (crtbeginT.o) registers the program's
// .eh_frame with the unwinder. The first exception then makes the unwinder sort every
// frame description of the program, so that an error at start-up (CLI11
// reports --version and bad arguments by throwing) would cost more than the whole call.
// Linked with --wrap for both functions, that registration does nothing; the unwinder
// then finds frames as it does in a dynamic program, through dl_iterate_phdr and the
// binary-search table of .eh_frame_hdr (--eh-frame-hdr), which needs no set-up.
extern "C" {
void __wrap___register_frame_info(const void*, void*) {}
void* __wrap___deregister_frame_info(const void*) {
  return nullptr;
}
}
