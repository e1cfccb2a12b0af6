// dlopen in the fully static machina-toolhost: never. A static program cannot safely load
// code that needs the C library (this build hands plugins to libexec/machina-toolhost),
// yet SQLite's file layer refers to dlopen for loadable extensions, which code.search's
// index never loads (nothing calls sqlite3_load_extension). Linked with --wrap=dlopen,
// that reference comes here, and glibc's static dlopen (with the linker's warning that
// it needs the shared libraries at run time) stays out of the program.
extern "C" void* __wrap_dlopen(const char*, int) {
  return nullptr;
}
