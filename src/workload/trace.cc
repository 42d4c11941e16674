#include "slicesched/workload/trace.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numbers>
#include <numeric>
#include <optional>
#include <random>
#include <string_view>
#include <system_error>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/status/status.h"
#include "slicesched/common/status.h"
#include "slicesched/common/stats.h"
#include "slicesched/common/strings.h"

namespace slicesched {
namespace {

// ---------------------------------------------------------------------------
// CSV reading.

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    return absl::NotFoundError(StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::InvalidArgumentError(StrCat(path, ": read error"));
  return data;
}

// Iterates over the lines of a file's contents, LF or CRLF, the last one
// possibly without a newline. Line numbers start at 1.
class LineReader {
 public:
  explicit LineReader(std::string_view data) : data_(data) {
    if (data_.substr(0, 3) == "\xEF\xBB\xBF") data_.remove_prefix(3);  // UTF-8 BOM
  }

  // Sets `line` to the next line (without its terminator); false at the end.
  bool Next(std::string_view& line) {
    if (pos_ >= data_.size()) return false;
    size_t end = data_.find('\n', pos_);
    if (end == std::string_view::npos) end = data_.size();
    line = data_.substr(pos_, end - pos_);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos_ = end + 1;
    ++line_number_;
    return true;
  }

  int line_number() const { return line_number_; }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  int line_number_ = 0;
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

bool IsBlank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t'; });
}

void SplitFields(std::string_view line, std::vector<std::string_view>& fields) {
  fields.clear();
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    if (comma == std::string_view::npos) {
      fields.push_back(Trim(line.substr(start)));
      return;
    }
    fields.push_back(Trim(line.substr(start, comma - start)));
    start = comma + 1;
  }
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Builds "<path>:<line>: <message...>" errors.
class ErrorContext {
 public:
  explicit ErrorContext(const std::string& path) : path_(path) {}

  template <typename... Args>
  absl::Status Error(int line, const Args&... args) const {
    return absl::InvalidArgumentError(StrCat(path_, ":", line, ": ", args...));
  }

 private:
  const std::string& path_;
};

// Reads the header line and resolves `wanted` column names (case-insensitive)
// to indices; -1 for an absent optional column. `required[i]` says whether
// wanted[i] must be present.
absl::Status ReadHeader(LineReader& lines, const ErrorContext& err,
                        const std::vector<std::string_view>& wanted,
                        const std::vector<bool>& required, std::vector<int>& index,
                        size_t& min_fields) {
  std::string_view line;
  bool found = false;
  while (lines.Next(line)) {
    if (!IsBlank(line)) {
      found = true;
      break;
    }
  }
  if (!found) return err.Error(1, "empty file (no header line)");
  const int header_line = lines.line_number();
  std::vector<std::string_view> names;
  SplitFields(line, names);
  index.assign(wanted.size(), -1);
  min_fields = 0;
  for (size_t w = 0; w < wanted.size(); ++w) {
    for (size_t c = 0; c < names.size(); ++c) {
      if (!EqualsIgnoreCase(names[c], wanted[w])) continue;
      if (index[w] >= 0) {
        return err.Error(header_line, "duplicate column '", wanted[w], "' in header '", line, "'");
      }
      index[w] = static_cast<int>(c);
    }
    if (index[w] < 0 && required[w]) {
      return err.Error(header_line, "missing column '", wanted[w], "' in header '", line, "'");
    }
    if (index[w] >= 0) min_fields = std::max(min_fields, static_cast<size_t>(index[w]) + 1);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Field parsers.

// A wall-clock instant as whole seconds since 1970-01-01 plus nanoseconds.
struct Instant {
  int64_t seconds = 0;
  int32_t nanos = 0;

  bool operator<(const Instant& o) const {
    return seconds != o.seconds ? seconds < o.seconds : nanos < o.nanos;
  }
  double SecondsSince(const Instant& base) const {
    return static_cast<double>(seconds - base.seconds) + (nanos - base.nanos) * 1e-9;
  }
};

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
int64_t DaysFromCivil(int64_t y, int m, int d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

int DaysInMonth(int64_t y, int m) {
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return m == 2 && leap ? 29 : kDays[m - 1];
}

// Reads exactly `n` digits at s[pos]; false if any is not a digit.
bool Digits(std::string_view s, size_t pos, size_t n, int& out) {
  if (pos + n > s.size()) return false;
  out = 0;
  for (size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    out = out * 10 + (s[i] - '0');
  }
  return true;
}

// Parses "YYYY-MM-DD HH:MM:SS[.f{0,9}]" ('T' also separates date and time).
// On failure returns a description of the problem.
std::optional<std::string> ParseTimestamp(std::string_view s, Instant& out) {
  int year, month, day, hour, minute, second;
  if (s.size() < 19 || !Digits(s, 0, 4, year) || s[4] != '-' || !Digits(s, 5, 2, month) ||
      s[7] != '-' || !Digits(s, 8, 2, day) || (s[10] != ' ' && s[10] != 'T') ||
      !Digits(s, 11, 2, hour) || s[13] != ':' || !Digits(s, 14, 2, minute) || s[16] != ':' ||
      !Digits(s, 17, 2, second)) {
    return "expected YYYY-MM-DD HH:MM:SS[.fffffff]";
  }
  int32_t nanos = 0;
  if (s.size() > 19) {
    if (s[19] != '.') return "expected YYYY-MM-DD HH:MM:SS[.fffffff]";
    const size_t digits = s.size() - 20;
    if (digits > 9) return "more than 9 fractional digits";
    int frac = 0;
    if (digits > 0 && !Digits(s, 20, digits, frac)) return "non-digit in the fractional seconds";
    nanos = frac;
    for (size_t i = digits; i < 9; ++i) nanos *= 10;
  }
  if (month < 1 || month > 12) return "month out of range";
  if (day < 1 || day > DaysInMonth(year, month)) return "day out of range";
  if (hour > 23) return "hour out of range";
  if (minute > 59) return "minute out of range";
  if (second > 59) return "second out of range";
  out.seconds = DaysFromCivil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second;
  out.nanos = nanos;
  return std::nullopt;
}

bool ParseNonNegativeInt(std::string_view s, int64_t& out) {
  if (s.empty() || s.front() == '+' || s.front() == '-') return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

bool ParseDouble(std::string_view s, double& out) {
  if (s.empty()) return false;
  if (s.front() == '+') s.remove_prefix(1);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && std::isfinite(out);
}

// ---------------------------------------------------------------------------
// Statistics helpers.

double Mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

void SortByArrival(std::vector<Request>& requests) {
  std::stable_sort(requests.begin(), requests.end(),
                   [](const Request& a, const Request& b) { return a.arrival_s < b.arrival_s; });
}

// ---------------------------------------------------------------------------
// Random variates from a std::mt19937_64, computed here so that the output
// does not depend on the standard library's distribution implementations.

class Variates {
 public:
  explicit Variates(uint64_t seed) : engine_(seed) {}

  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  // Exponential with the given rate (> 0).
  double Exponential(double rate) { return -std::log1p(-Uniform()) / rate; }
  // Standard normal (Box-Muller; one value per pair of uniforms).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  double LogNormal(double mu, double sigma) { return std::exp(mu + sigma * Normal()); }

 private:
  std::mt19937_64 engine_;
};

constexpr double kZ90 = 1.2815515655446004;  // standard normal 90% quantile

// A clamped, rounded log-normal token count with the given median and p90.
int64_t DrawTokens(Variates& rng, double median, double p90, int64_t lo, int64_t hi) {
  const double mu = std::log(std::max(median, 1e-9));
  const double sigma = p90 > median ? std::log(p90 / median) / kZ90 : 0.0;
  const double x = std::exp(mu + sigma * rng.Normal());
  const double clamped = std::clamp(std::round(x), static_cast<double>(lo), static_cast<double>(hi));
  return static_cast<int64_t>(clamped);
}


// ---------------------------------------------------------------------------
// Loaders.

// Walks the data rows after the header: skips blank lines, checks the field
// count, parses the timestamp in column `ts_col` (named `ts_name` in errors)
// and hands the line number, the fields and the instant to `row`, which
// returns OK or the row's error. `what` names the rows for the empty-file
// error ("requests", "jobs").
template <typename RowFn>
absl::Status ForEachTimedRow(LineReader& lines, const ErrorContext& err, size_t min_fields, int ts_col,
                             std::string_view ts_name, std::string_view what, RowFn row) {
  std::vector<std::string_view> fields;
  std::string_view line;
  size_t rows = 0;
  while (lines.Next(line)) {
    if (IsBlank(line)) continue;
    const int n = lines.line_number();
    SplitFields(line, fields);
    if (fields.size() < min_fields) {
      return err.Error(n, "expected at least ", min_fields, " fields, got ", fields.size(), ": '",
                       line, "'");
    }
    Instant t;
    if (auto problem = ParseTimestamp(fields[ts_col], t)) {
      return err.Error(n, "column '", ts_name, "': bad timestamp '", fields[ts_col], "' (", *problem,
                       ")");
    }
    SLICESCHED_RETURN_IF_ERROR(row(n, fields, t));
    ++rows;
  }
  if (rows == 0) return err.Error(lines.line_number(), "no ", what, " after the header");
  return absl::OkStatus();
}

// Orders `rows` by their instants (stable: ties keep file order, compared on
// the exact instants rather than doubles) and lets `set` store each row's
// seconds since the earliest instant.
template <typename T, typename SetFn>
std::vector<T> SortByTime(std::vector<T> rows, const std::vector<Instant>& times, SetFn set) {
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return times[a] < times[b]; });
  const Instant first = times[order.front()];
  std::vector<T> sorted;
  sorted.reserve(rows.size());
  for (size_t i : order) {
    sorted.push_back(std::move(rows[i]));
    set(sorted.back(), times[i].SecondsSince(first));
  }
  return sorted;
}

}  // namespace

absl::StatusOr<std::vector<Request>> LoadAzureLlmTrace(const std::string& path) {
  SLICESCHED_ASSIGN_OR_RETURN(const std::string data, ReadFile(path));
  const ErrorContext err(path);
  LineReader lines(data);
  static const std::vector<std::string_view> kColumns = {"TIMESTAMP", "ContextTokens",
                                                         "GeneratedTokens"};
  std::vector<int> col;
  size_t min_fields = 0;
  SLICESCHED_RETURN_IF_ERROR(ReadHeader(lines, err, kColumns, {true, true, true}, col, min_fields));

  std::vector<Instant> times;
  std::vector<Request> rows;
  times.reserve(data.size() / 36);
  rows.reserve(data.size() / 36);
  SLICESCHED_RETURN_IF_ERROR(ForEachTimedRow(
      lines, err, min_fields, col[0], kColumns[0], "requests",
      [&](int n, const std::vector<std::string_view>& fields, const Instant& t) -> absl::Status {
        Request r;
        for (int k = 1; k <= 2; ++k) {
          int64_t& value = k == 1 ? r.context_tokens : r.generated_tokens;
          if (!ParseNonNegativeInt(fields[col[k]], value)) {
            return err.Error(n, "column '", kColumns[k], "': expected a non-negative integer, got '",
                             fields[col[k]], "'");
          }
        }
        times.push_back(t);
        rows.push_back(r);
        return absl::OkStatus();
      }));
  return SortByTime(std::move(rows), times, [](Request& r, double s) { r.arrival_s = s; });
}

absl::StatusOr<std::vector<Job>> LoadJobTrace(const std::string& path) {
  SLICESCHED_ASSIGN_OR_RETURN(const std::string data, ReadFile(path));
  const ErrorContext err(path);
  LineReader lines(data);
  static const std::vector<std::string_view> kColumns = {"timestamp", "duration", "num_gpus",
                                                         "tenant", "cluster"};
  std::vector<int> col;
  size_t min_fields = 0;
  SLICESCHED_RETURN_IF_ERROR(
      ReadHeader(lines, err, kColumns, {true, true, true, false, false}, col, min_fields));
  const int tenant_col = col[3] >= 0 ? col[3] : col[4];
  if (col[3] >= 0 && col[4] >= 0) {
    // Both present: `tenant` wins; `cluster` need not be in every row.
    min_fields = static_cast<size_t>(std::max({col[0], col[1], col[2], col[3]})) + 1;
  }

  std::vector<Instant> times;
  std::vector<Job> jobs;
  SLICESCHED_RETURN_IF_ERROR(ForEachTimedRow(
      lines, err, min_fields, col[0], "timestamp", "jobs",
      [&](int n, const std::vector<std::string_view>& fields, const Instant& t) -> absl::Status {
        Job job;
        if (!ParseDouble(fields[col[1]], job.duration_s) || job.duration_s < 0) {
          return err.Error(n, "column 'duration': expected a finite number of seconds >= 0, got '",
                           fields[col[1]], "'");
        }
        int64_t gpus = 0;
        if (!ParseNonNegativeInt(fields[col[2]], gpus) || gpus < 1 ||
            gpus > std::numeric_limits<int>::max()) {
          return err.Error(n, "column 'num_gpus': expected a positive integer, got '", fields[col[2]],
                           "'");
        }
        job.num_gpus = static_cast<int>(gpus);
        if (tenant_col >= 0) job.tenant = std::string(fields[tenant_col]);
        times.push_back(t);
        jobs.push_back(std::move(job));
        return absl::OkStatus();
      }));
  return SortByTime(std::move(jobs), times, [](Job& j, double s) { j.submit_s = s; });
}

// ---------------------------------------------------------------------------
// Summary and transformations.

TraceSummary Summarize(const std::vector<Request>& requests) {
  TraceSummary s;
  s.requests = requests.size();
  if (requests.empty()) return s;
  std::vector<double> arrivals, context, output;
  arrivals.reserve(requests.size());
  context.reserve(requests.size());
  output.reserve(requests.size());
  for (const Request& r : requests) {
    arrivals.push_back(r.arrival_s);
    context.push_back(static_cast<double>(r.context_tokens));
    output.push_back(static_cast<double>(r.generated_tokens));
  }
  std::sort(arrivals.begin(), arrivals.end());
  std::sort(context.begin(), context.end());
  std::sort(output.begin(), output.end());
  s.span_s = arrivals.back() - arrivals.front();
  s.mean_rate_per_s = s.span_s > 0 ? s.requests / s.span_s : 0;
  if (arrivals.size() >= 3) {
    const double n = static_cast<double>(arrivals.size() - 1);
    const double mean = s.span_s / n;
    double sq = 0;
    for (size_t i = 1; i < arrivals.size(); ++i) {
      const double d = arrivals[i] - arrivals[i - 1] - mean;
      sq += d * d;
    }
    s.interarrival_cv = mean > 0 ? std::sqrt(sq / n) / mean : 0;
  }
  s.context_p50 = QuantileOfSorted(context, 0.5);
  s.context_p90 = QuantileOfSorted(context, 0.9);
  s.context_p99 = QuantileOfSorted(context, 0.99);
  s.output_p50 = QuantileOfSorted(output, 0.5);
  s.output_p90 = QuantileOfSorted(output, 0.9);
  s.output_p99 = QuantileOfSorted(output, 0.99);
  s.context_mean = Mean(context);
  s.output_mean = Mean(output);
  return s;
}

std::vector<Request> Thin(const std::vector<Request>& requests, double keep, uint64_t seed) {
  ABSL_INTERNAL_CHECK(std::isfinite(keep) && keep > 0 && keep <= 1, "Thin: keep must be in (0, 1]");
  std::mt19937_64 rng(seed);
  std::vector<Request> out;
  out.reserve(static_cast<size_t>(static_cast<double>(requests.size()) * keep) + 1);
  for (const Request& r : requests) {
    // 53 random bits -> [0, 1); one draw per request keeps it reproducible.
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    if (u < keep) out.push_back(r);
  }
  return out;
}

std::vector<Request> ScaleLoad(const std::vector<Request>& requests, double scale) {
  ABSL_INTERNAL_CHECK(std::isfinite(scale) && scale > 0, "ScaleLoad: scale must be finite and > 0");
  std::vector<Request> out = requests;
  for (Request& r : out) r.arrival_s /= scale;
  return out;
}

std::vector<Request> Window(const std::vector<Request>& requests, double start_s, double duration_s) {
  std::vector<Request> out;
  if (!(duration_s > 0)) return out;
  const double end_s = start_s + duration_s;
  for (const Request& r : requests) {
    if (r.arrival_s >= start_s && r.arrival_s < end_s) {
      out.push_back(r);
      out.back().arrival_s -= start_s;
    }
  }
  return out;
}

std::vector<Request> CyclicShift(const std::vector<Request>& requests, double fraction) {
  ABSL_INTERNAL_CHECK(std::isfinite(fraction), "CyclicShift: fraction must be finite");
  std::vector<Request> out = requests;
  SortByArrival(out);
  if (out.size() < 2) return out;
  const double t0 = out.front().arrival_s;
  const double span = out.back().arrival_s - t0;
  if (!(span > 0)) return out;
  const double f = fraction - std::floor(fraction);
  if (f == 0) return out;
  const double n = static_cast<double>(out.size());
  const double period = span * n / (n - 1);
  const double shift = f * period;
  for (Request& r : out) {
    double x = r.arrival_s - t0 + shift;
    if (x >= period) x -= period;
    r.arrival_s = t0 + std::clamp(x, 0.0, std::nextafter(period, 0.0));
  }
  SortByArrival(out);
  return out;
}

// ---------------------------------------------------------------------------
// Built-in workload.

std::vector<Request> GenerateBuiltInWorkload(const BuiltInWorkloadModel& model, double duration_s,
                                             uint64_t seed) {
  std::vector<Request> out;
  if (!(duration_s > 0) || !std::isfinite(duration_s)) return out;
  Variates rng(seed);
  constexpr double kMinPeriod = 1e-3;

  // 1. The intensity path: ON segments [start, end) with a rate each.
  struct Segment {
    double start, end, rate;
  };
  std::vector<Segment> segments;
  const double on_mean = std::exp(model.on_log_mu + model.on_log_sigma * model.on_log_sigma / 2);
  const double off_mean = std::exp(model.off_log_mu + model.off_log_sigma * model.off_log_sigma / 2);
  bool on = rng.Uniform() < on_mean / (on_mean + off_mean);
  double integral = 0;
  for (double t = 0; t < duration_s; on = !on) {
    double length;
    if (on) {
      length = std::max(kMinPeriod, rng.LogNormal(model.on_log_mu, model.on_log_sigma));
      const double rate = rng.LogNormal(model.burst_rate_log_mu, model.burst_rate_log_sigma);
      const double end = std::min(t + length, duration_s);
      segments.push_back({t, end, rate});
      integral += (end - t) * rate;
    } else {
      length = std::max(kMinPeriod, rng.LogNormal(model.off_log_mu, model.off_log_sigma));
    }
    t += length;
  }

  // 2. Normalize so that the intensity integrates to mean_rate * duration.
  double factor = 1.0;
  if (model.normalize_rate) {
    if (!(integral > 0) || !(model.mean_rate_per_s > 0)) return out;
    factor = model.mean_rate_per_s * duration_s / integral;
  }

  // 3. Poisson arrivals within each segment.
  for (const Segment& seg : segments) {
    const double rate = seg.rate * factor;
    if (!(rate > 0) || !std::isfinite(rate)) continue;
    for (double t = seg.start + rng.Exponential(rate); t < seg.end; t += rng.Exponential(rate)) {
      out.push_back(Request{t, 0, 0});
    }
  }

  // 4. Lengths, independent of arrivals and of each other.
  for (Request& r : out) {
    r.context_tokens = DrawTokens(rng, model.context_median, model.context_p90, model.context_min,
                                  model.context_max);
    r.generated_tokens = DrawTokens(rng, model.output_median, model.output_p90, model.output_min,
                                    model.output_max);
  }
  return out;
}

}  // namespace slicesched
