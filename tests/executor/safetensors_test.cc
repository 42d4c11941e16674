// safetensors reader/writer: round trips and corrupt files. Torch-free TU.
#include "slicesched/executor/torch/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/gmg/llama.h"

namespace slicesched::executor {
namespace {

std::string TempPath(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "/slicesched_" + info->name() + "_" + name;
}

// Writes `len` as the 8-byte header length, then `header` and `data`.
std::string WriteRaw(const std::string& name, uint64_t len, const std::string& header,
                     const std::string& data) {
  const std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  char buf[8];
  std::memcpy(buf, &len, 8);
  out.write(buf, 8);
  out << header << data;
  return path;
}

std::string WriteWithHeader(const std::string& name, const std::string& header,
                            size_t data_bytes) {
  return WriteRaw(name, header.size(), header, std::string(data_bytes, '\0'));
}

bool Contains(const absl::Status& s, const std::string& needle) {
  return s.message().find(needle) != absl::string_view::npos;
}

TEST(SafetensorsTest, RoundTrip) {
  const std::vector<float> f = {1.5f, -2.f, 3.25f, 0.f, 7.f, -8.5f};
  const std::vector<int64_t> i = {1, -2, 1ll << 40};
  const std::string path = TempPath("rt.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"weights \"a\"", Tensor::FromFloat(f, {2, 3})},
                                {"ids", Tensor::FromInt64(i, {3})},
                                {"empty", Tensor::FromFloat({}, {0, 4})}},
                               {{"format", "pt"}})
                  .ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->names(), (std::vector<std::string>{"weights \"a\"", "ids", "empty"}));
  EXPECT_EQ(file->metadata().at("format"), "pt");
  const int64_t shape_a[] = {2, 3};
  auto a = file->Get("weights \"a\"", shape_a, DType::kF32);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ToFloat(), f);
  const int64_t shape_ids[] = {3};
  auto ids = file->Get("ids", shape_ids, DType::kI64);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->ToInt64(), i);
  auto empty = file->Get("empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->shape(), (std::vector<int64_t>{0, 4}));
}

TEST(SafetensorsTest, LlamaWeightsRoundTripGiveIdenticalLogits) {
  auto dims = LlamaPreset("tiny");
  ASSERT_TRUE(dims.ok());
  auto w = LlamaWeights::FromSeed(*dims, 42);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string path = TempPath("tiny.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, (*w)->NamedTensors()).ok());
  auto loaded = LlamaWeights::FromSafetensors(*dims, path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->TotalBytes(), (*w)->TotalBytes());

  const Tensor tokens = Tensor::FromInt64(std::vector<int64_t>{5, 17, 250, 0, 9, 9}, {2, 3});
  auto ref_a = ReferenceForward(**w, tokens);
  auto ref_b = ReferenceForward(**loaded, tokens);
  ASSERT_TRUE(ref_a.ok() && ref_b.ok());
  EXPECT_EQ(ref_a->MaxAbsDiff(*ref_b), 0.0);
  // And the serving path.
  auto run = [&](const LlamaWeights& m) {
    Tensor h = *Embedding(m, tokens);
    for (int64_t g = 0; g < m.num_groups(); ++g) h = *FusedLayers(m, g, h, nullptr, 0);
    return *LmHead(m, h);
  };
  EXPECT_EQ(run(**w).MaxAbsDiff(run(**loaded)), 0.0);

  // The same file against other dimensions: a shape error naming the tensor.
  LlamaDims other = *dims;
  other.vocab = 128;
  auto mismatch = LlamaWeights::FromSafetensors(other, path);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(mismatch.status(), "model.embed_tokens.weight")) << mismatch.status();
  EXPECT_TRUE(Contains(mismatch.status(), "[256, 64], expected [128, 64]")) << mismatch.status();
  // A file lacking a tensor.
  auto named = (*w)->NamedTensors();
  named.pop_back();  // lm_head.weight
  const std::string partial = TempPath("partial.safetensors");
  ASSERT_TRUE(WriteSafetensors(partial, named).ok());
  auto missing = LlamaWeights::FromSafetensors(*dims, partial);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status(), "'lm_head.weight' is missing")) << missing.status();
  EXPECT_TRUE(Contains(missing.status(), partial)) << missing.status();
}

TEST(SafetensorsTest, GetChecksNameShapeAndDtype) {
  const std::string path = TempPath("get.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", Tensor::FromFloat(std::vector<float>(6, 1.f), {2, 3})}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  const int64_t right[] = {2, 3}, wrong[] = {3, 2};
  auto missing = file->Get("y", right, DType::kF32);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status(), "tensor 'y' is missing")) << missing.status();
  EXPECT_TRUE(Contains(missing.status(), path));
  auto shape = file->Get("x", wrong, DType::kF32);
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(shape.status(), "tensor 'x' has shape [2, 3], expected [3, 2]"))
      << shape.status();
  auto dtype = file->Get("x", right, DType::kBF16);
  EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(dtype.status(), "tensor 'x' has dtype F32, expected BF16")) << dtype.status();
}

struct CorruptCase {
  const char* name;
  std::string path;
  const char* expected;  // substring of the error
};

TEST(SafetensorsTest, CorruptFilesGiveClearErrors) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  std::vector<CorruptCase> cases = {
      {"truncated length", WriteRaw("trunc", 0, "", "").substr(0, 0), ""},
      {"header beyond file", WriteRaw("beyond", 1000, "{}", std::string(10, '\0')),
       "header length 1000 exceeds the file"},
      {"bad json", WriteWithHeader("badjson", R"({"a":{"dtype":"F32",)", 16), "malformed JSON"},
      {"trailing garbage", WriteWithHeader("trailing", "{" + ok_entry + "}x", 16),
       "trailing characters"},
      {"not an object", WriteWithHeader("array", "[1,2]", 0), "not an object"},
      {"duplicate tensor", WriteWithHeader("dup", "{" + ok_entry + "," + ok_entry + "}", 16),
       "duplicate key \"a\""},
      {"unknown dtype",
       WriteWithHeader("dtype", R"({"a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}})", 8),
       "tensor 'a': unknown dtype \"F99\""},
      {"unsupported dtype",
       WriteWithHeader("f64", R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", 16),
       "tensor 'a': dtype F64 is not supported"},
      {"size mismatch",
       WriteWithHeader("size", R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 16),
       "tensor 'a': data_offsets [0, 12] span 12 bytes but shape [2, 2] x F32 needs 16"},
      {"offsets past data",
       WriteWithHeader("past", R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]}})", 16),
       "tensor 'a': data_offsets [8, 24] run past the data section (16 bytes)"},
      {"negative dim",
       WriteWithHeader("neg", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       "tensor 'a': shape holds something other than a non-negative integer"},
      {"overlap",
       WriteWithHeader("overlap",
                       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                       R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                       24),
       "tensors 'a' [0, 16) and 'b' [8, 24) overlap"},
      {"missing field", WriteWithHeader("field", R"({"a":{"dtype":"F32","shape":[4]}})", 16),
       "tensor 'a': needs"},
  };
  // A file shorter than the 8-byte length field.
  {
    const std::string path = TempPath("short");
    std::ofstream(path, std::ios::binary) << "abc";
    cases[0] = {"truncated length", path, "truncated: 3 bytes, shorter than the 8-byte header"};
  }
  for (const auto& c : cases) {
    auto file = SafetensorsFile::Open(c.path);
    ASSERT_FALSE(file.ok()) << c.name;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_TRUE(Contains(file.status(), c.expected)) << c.name << ": " << file.status();
    EXPECT_TRUE(Contains(file.status(), c.path)) << c.name << ": " << file.status();
  }
  auto absent = SafetensorsFile::Open(TempPath("does_not_exist"));
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound) << absent.status();
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  const std::string path = TempPath("bad.safetensors");
  const Tensor t = Tensor::FromFloat(std::vector<float>{1.f}, {1});
  EXPECT_FALSE(WriteSafetensors(path, {{"a", t}, {"a", t}}).ok());
  EXPECT_FALSE(WriteSafetensors(path, {{"", t}}).ok());
  EXPECT_FALSE(WriteSafetensors(path, {{"u", Tensor()}}).ok());
  EXPECT_FALSE(WriteSafetensors("/nonexistent-dir/x.safetensors", {{"a", t}}).ok());
}

}  // namespace
}  // namespace slicesched::executor
