// The one translation unit that includes SentencePiece's headers
// (sentencepiece_backend.cc). They declare `namespace absl { using
// std::string_view; }`, which clashes with the system Abseil, so nothing
// here mentions Abseil: plain std types and error strings only.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace slicesched::jobs::sentencepiece_backend {

struct Model;  // a loaded sentencepiece::SentencePieceProcessor

std::shared_ptr<const Model> Load(const std::string& path, std::string* error);
int VocabSize(const Model& m);
bool Encode(const Model& m, std::string_view text, std::vector<int>* ids, std::string* error);
bool Decode(const Model& m, const std::vector<int>& ids, std::string* text, std::string* error);
// SentencePieceTrainer::Train with command-line style arguments.
bool Train(const std::string& args, std::string* error);

}  // namespace slicesched::jobs::sentencepiece_backend
