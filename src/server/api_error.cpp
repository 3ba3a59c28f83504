// ApiError and the error JSON shape OpenAI's clients parse.
#include "server/api_error.h"

namespace specdec::server {

namespace {

nlohmann::json or_null(const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); }

}  // namespace

ApiError::ApiError(int status, std::string message, std::string type, std::string param, std::string code)
    : std::runtime_error(std::move(message)),
      status_(status),
      type_(std::move(type)),
      param_(std::move(param)),
      code_(std::move(code)) {}

nlohmann::json ApiError::body() const { return error_body(what(), type_, param_, code_); }

ApiError invalid_field(const std::string& param, const std::string& message) {
  return ApiError(400, message, "invalid_request_error", param);
}

nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& param,
                          const std::string& code) {
  return {{"error", {{"message", message}, {"type", type}, {"param", or_null(param)}, {"code", or_null(code)}}}};
}

}  // namespace specdec::server
