// SafetensorsFile: one .safetensors file mapped read-only, its header validated before any
// tensor view is handed out, so later code can trust every span and shape it sees.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "model/config_json.h"
#include "model/weights.h"

namespace specdec {

namespace {

using config_json::Json;

// The file descriptor is needed only while mapping; the mapping outlives it.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

DType parse_dtype(const std::string& name, const std::string& where) {
  if (name == "F32") return DType::f32;
  if (name == "BF16") return DType::bf16;
  if (name == "F16") return DType::f16;
  if (name == "I32") return DType::i32;
  fail(where, ": dtype \"", name, "\" is not supported (supported: F32, BF16, F16, I32)");
}

uint64_t read_offset(const Json& v, const std::string& where) {
  SPECDEC_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), where,
                ": data_offsets must be non-negative integers, got ", v.dump());
  return v.get<uint64_t>();
}

struct Span {
  uint64_t begin, end;
  const std::string* name;
};

// Builds one tensor view from its header entry; `data` is the start of the data section.
Tensor parse_entry(const std::string& name, const Json& e, char* data, uint64_t data_bytes,
                   const std::string& file, std::vector<Span>& spans) {
  const std::string where = str_cat(file, ": tensor \"", name, "\"");
  SPECDEC_CHECK(e.is_object(), where, ": header entry must be an object");
  const auto dtype_name = config_json::get_string(e, "dtype", where);
  SPECDEC_CHECK(dtype_name.has_value(), where, ": header entry has no dtype");
  const DType dtype = parse_dtype(*dtype_name, where);

  auto shape_it = e.find("shape");
  SPECDEC_CHECK(shape_it != e.end() && shape_it->is_array(), where, ": header entry has no shape list");
  SPECDEC_CHECK(shape_it->size() <= 4, where, ": rank ", shape_it->size(), " exceeds 4");
  std::vector<int64_t> shape;
  uint64_t numel = 1;
  for (const Json& d : *shape_it) {
    SPECDEC_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), where,
                  ": shape entries must be non-negative integers, got ", shape_it->dump());
    const uint64_t n = d.get<uint64_t>();
    // Capped well below 2^64 / 4 so numel * dtype size cannot wrap around and match a span.
    SPECDEC_CHECK(n < (uint64_t{1} << 40) && (n == 0 || numel <= (uint64_t{1} << 56) / n), where,
                  ": shape ", shape_it->dump(), " is too large");
    numel *= n;
    shape.push_back(static_cast<int64_t>(n));
  }
  if (shape.empty()) shape.push_back(1);  // a scalar: one element, viewed as [1]

  auto off_it = e.find("data_offsets");
  SPECDEC_CHECK(off_it != e.end() && off_it->is_array() && off_it->size() == 2, where,
                ": header entry needs data_offsets [begin, end]");
  const uint64_t begin = read_offset((*off_it)[0], where);
  const uint64_t end = read_offset((*off_it)[1], where);
  SPECDEC_CHECK(begin <= end, where, ": data_offsets [", begin, ", ", end, "] are reversed");
  SPECDEC_CHECK(end <= data_bytes, where, ": data_offsets [", begin, ", ", end,
                "] extend beyond the data section of ", data_bytes, " bytes");
  const uint64_t expected = numel * dtype_size(dtype);
  SPECDEC_CHECK(end - begin == expected, where, ": size mismatch: shape ", shape_it->dump(), " of ",
                *dtype_name, " needs ", expected, " bytes but data_offsets span ", end - begin);
  spans.push_back({begin, end, &name});

  Tensor t;
  t.data = data + begin;
  t.dtype = dtype;
  t.device = Device::cpu;
  t.rank = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.dims[i] = shape[i];
  return t;
}

void check_no_overlap(std::vector<Span>& spans, const std::string& file) {
  std::erase_if(spans, [](const Span& s) { return s.begin == s.end; });  // empty tensors own no bytes
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    const Span& a = spans[i - 1];
    const Span& b = spans[i];
    SPECDEC_CHECK(b.begin >= a.end, file, ": tensors \"", *a.name, "\" [", a.begin, ", ", a.end,
                  ") and \"", *b.name, "\" [", b.begin, ", ", b.end, ") overlap");
  }
}

}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string file = path.string();
  Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  SPECDEC_CHECK(fd.get() >= 0, file, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  SPECDEC_CHECK(::fstat(fd.get(), &st) == 0, file, ": cannot stat: ", std::strerror(errno));
  SPECDEC_CHECK(S_ISREG(st.st_mode), file, ": not a regular file");
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  SPECDEC_CHECK(file_bytes >= 8, file, ": truncated: ", file_bytes,
                " bytes, shorter than the 8-byte header length");

  auto f = std::make_unique<SafetensorsFile>(Key{});
  f->path_ = path;
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  SPECDEC_CHECK(map != MAP_FAILED, file, ": cannot map ", file_bytes, " bytes: ", std::strerror(errno));
  f->map_ = map;
  f->map_bytes_ = file_bytes;  // from here the destructor unmaps, whatever fails below

  const auto* bytes = static_cast<const unsigned char*>(map);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian u64
  SPECDEC_CHECK(header_len <= file_bytes - 8, file, ": header length ", header_len,
                " extends beyond the file of ", file_bytes, " bytes (truncated or not safetensors)");
  const std::string header_text(reinterpret_cast<const char*>(bytes) + 8, header_len);
  Json header;
  try {
    header = Json::parse(header_text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(file, ": invalid header JSON at byte ", e.byte, ": ", config_json::describe(e));
  } catch (const nlohmann::json::out_of_range& e) {  // a number beyond double, e.g. 1e606
    fail(file, ": invalid header JSON: ", config_json::describe(e));
  }
  SPECDEC_CHECK(header.is_object(), file, ": header must be a JSON object");

  char* data = static_cast<char*>(map) + 8 + header_len;
  const uint64_t data_bytes = file_bytes - 8 - header_len;
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;  // free-form strings, nothing we rely on
    auto [pos, inserted] = f->tensors_.emplace(it.key(), Tensor{});
    SPECDEC_CHECK(inserted, file, ": tensor \"", it.key(), "\" appears twice in the header");
    pos->second = parse_entry(pos->first, it.value(), data, data_bytes, file, spans);
  }
  check_no_overlap(spans, file);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

}  // namespace specdec
