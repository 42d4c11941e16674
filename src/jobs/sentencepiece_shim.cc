// A small shared object around Debian's libsentencepiece, loaded at run
// time by sentencepiece_backend.cc into a link namespace of its own
// (dlmopen).
//
// Why: libsentencepiece carries its own copy of protobuf-lite and exports
// its symbols. Linked into a process that also has the system libprotobuf
// (gRPC) and LibTorch, the dynamic linker binds one set of names for all of
// them, and the process crashes at start. Only the C functions below are
// exported; buffers they return are freed by slicesched_sp_release, on this
// side.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define SP_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

void SetError(const std::string& message, char* err, size_t errlen) {
  if (err == nullptr || errlen == 0) return;
  std::strncpy(err, message.c_str(), errlen - 1);
  err[errlen - 1] = '\0';
}

}  // namespace

SP_EXPORT void* slicesched_sp_load(const char* path, char* err, size_t errlen) {
  auto* p = new sentencepiece::SentencePieceProcessor();
  const auto status = p->Load(path);
  if (!status.ok()) {
    SetError(status.ToString(), err, errlen);
    delete p;
    return nullptr;
  }
  return p;
}

SP_EXPORT void slicesched_sp_free(void* model) { delete static_cast<sentencepiece::SentencePieceProcessor*>(model); }

SP_EXPORT int slicesched_sp_vocab(const void* model) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(model)->GetPieceSize();
}

SP_EXPORT void slicesched_sp_release(void* p) { std::free(p); }

// *ids (malloc'ed, freed with slicesched_sp_release) and *n on success (returns 1).
SP_EXPORT int slicesched_sp_encode(const void* model, const char* text, size_t len, int** ids, size_t* n, char* err,
                                   size_t errlen) {
  std::vector<int> out;
  const auto status =
      static_cast<const sentencepiece::SentencePieceProcessor*>(model)->Encode(std::string(text, len), &out);
  if (!status.ok()) {
    SetError(status.ToString(), err, errlen);
    return 0;
  }
  *n = out.size();
  *ids = static_cast<int*>(std::malloc(sizeof(int) * (out.empty() ? 1 : out.size())));
  if (!out.empty()) std::memcpy(*ids, out.data(), sizeof(int) * out.size());
  return 1;
}

// *text (malloc'ed, NUL-terminated, freed with slicesched_sp_release) and *len on success.
SP_EXPORT int slicesched_sp_decode(const void* model, const int* ids, size_t n, char** text, size_t* len, char* err,
                                   size_t errlen) {
  std::string out;
  const auto status = static_cast<const sentencepiece::SentencePieceProcessor*>(model)->Decode(
      std::vector<int>(ids, ids + n), &out);
  if (!status.ok()) {
    SetError(status.ToString(), err, errlen);
    return 0;
  }
  *len = out.size();
  *text = static_cast<char*>(std::malloc(out.size() + 1));
  std::memcpy(*text, out.c_str(), out.size() + 1);
  return 1;
}

SP_EXPORT int slicesched_sp_train(const char* args, char* err, size_t errlen) {
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) SetError(status.ToString(), err, errlen);
  return status.ok() ? 1 : 0;
}
