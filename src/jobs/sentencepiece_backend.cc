#include "sentencepiece_backend.h"

#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // dlmopen
#endif
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

namespace slicesched::jobs::sentencepiece_backend {
namespace {

// The shim's entry points (sentencepiece_shim.cc).
struct Api {
  void* (*load)(const char*, char*, size_t) = nullptr;
  void (*free_model)(void*) = nullptr;
  int (*vocab)(const void*) = nullptr;
  int (*encode)(const void*, const char*, size_t, int**, size_t*, char*, size_t) = nullptr;
  int (*decode)(const void*, const int*, size_t, char**, size_t*, char*, size_t) = nullptr;
  int (*train)(const char*, char*, size_t) = nullptr;
  void (*release)(void*) = nullptr;  // frees what encode/decode returned
  std::string error;  // why the shim could not be loaded
};

// The shim and its libraries (libsentencepiece with its protobuf-lite, and
// their own C and C++ runtimes) get a link namespace of their own, where
// nothing of the process can interpose on their symbols. RTLD_DEEPBIND is
// not enough: it splits libstdc++'s stream objects, and the trainer's first
// log line crashes. Only C types cross the boundary, and memory is freed on
// the side that allocated it. The sanitizer runtimes do not support
// dlmopen: there the shim is loaded into the process's namespace.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
void* OpenIsolated(const char* path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
#else
void* OpenIsolated(const char* path) { return dlmopen(LM_ID_NEWLM, path, RTLD_NOW | RTLD_LOCAL); }
#endif

// Where the shim is: $SLICESCHED_SENTENCEPIECE_SHIM, beside the executable,
// in ../lib beside it, or where the build put it.
std::vector<std::string> Candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("SLICESCHED_SENTENCEPIECE_SHIM"); env != nullptr && *env != '\0') {
    out.emplace_back(env);
  }
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / SLICESCHED_SENTENCEPIECE_SHIM_NAME).string());
    out.push_back((exe.parent_path() / ".." / "lib" / SLICESCHED_SENTENCEPIECE_SHIM_NAME).string());
  }
  out.emplace_back(SLICESCHED_SENTENCEPIECE_SHIM_PATH);
  return out;
}

const Api& GetApi() {
  static Api api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* handle = nullptr;
    std::string tried;
    for (const std::string& path : Candidates()) {
      if (!std::filesystem::exists(path)) continue;
      handle = OpenIsolated(path.c_str());
      if (handle != nullptr) break;
      tried += path + ": " + dlerror() + "; ";
    }
    if (handle == nullptr) {
      api.error = "cannot load the SentencePiece shim " + std::string(SLICESCHED_SENTENCEPIECE_SHIM_NAME) +
                  (tried.empty() ? " (not found beside the executable, in ../lib, or in the build tree; set "
                                   "SLICESCHED_SENTENCEPIECE_SHIM)"
                                 : " (" + tried + ")");
      return;
    }
    auto sym = [&](const char* name) { return dlsym(handle, name); };
    api.load = reinterpret_cast<decltype(api.load)>(sym("slicesched_sp_load"));
    api.free_model = reinterpret_cast<decltype(api.free_model)>(sym("slicesched_sp_free"));
    api.vocab = reinterpret_cast<decltype(api.vocab)>(sym("slicesched_sp_vocab"));
    api.encode = reinterpret_cast<decltype(api.encode)>(sym("slicesched_sp_encode"));
    api.decode = reinterpret_cast<decltype(api.decode)>(sym("slicesched_sp_decode"));
    api.train = reinterpret_cast<decltype(api.train)>(sym("slicesched_sp_train"));
    api.release = reinterpret_cast<decltype(api.release)>(sym("slicesched_sp_release"));
    if (!api.load || !api.free_model || !api.vocab || !api.encode || !api.decode || !api.train || !api.release) {
      api.error = "the SentencePiece shim lacks its entry points";
      api.load = nullptr;
    }
  });
  return api;
}

constexpr size_t kErrLen = 512;

}  // namespace

struct Model {
  void* handle = nullptr;
  ~Model() {
    if (handle != nullptr) GetApi().free_model(handle);
  }
};

std::shared_ptr<const Model> Load(const std::string& path, std::string* error) {
  const Api& api = GetApi();
  if (api.load == nullptr) {
    *error = api.error;
    return nullptr;
  }
  char err[kErrLen] = {0};
  void* h = api.load(path.c_str(), err, kErrLen);
  if (h == nullptr) {
    *error = err;
    return nullptr;
  }
  auto m = std::make_shared<Model>();
  m->handle = h;
  return m;
}

int VocabSize(const Model& m) { return GetApi().vocab(m.handle); }

bool Encode(const Model& m, std::string_view text, std::vector<int>* ids, std::string* error) {
  char err[kErrLen] = {0};
  int* out = nullptr;
  size_t n = 0;
  if (!GetApi().encode(m.handle, text.data(), text.size(), &out, &n, err, kErrLen)) {
    *error = err;
    return false;
  }
  ids->assign(out, out + n);
  GetApi().release(out);
  return true;
}

bool Decode(const Model& m, const std::vector<int>& ids, std::string* text, std::string* error) {
  char err[kErrLen] = {0};
  char* out = nullptr;
  size_t n = 0;
  if (!GetApi().decode(m.handle, ids.data(), ids.size(), &out, &n, err, kErrLen)) {
    *error = err;
    return false;
  }
  text->assign(out, n);
  GetApi().release(out);
  return true;
}

bool Train(const std::string& args, std::string* error) {
  const Api& api = GetApi();
  if (api.train == nullptr) {
    *error = api.error;
    return false;
  }
  char err[kErrLen] = {0};
  if (!api.train(args.c_str(), err, kErrLen)) {
    *error = err;
    return false;
  }
  return true;
}

}  // namespace slicesched::jobs::sentencepiece_backend
