// OpenAI's error object: every failure a client sees is {"error": {"message", "type", "param",
// "code"}} with an HTTP status, thrown as ApiError from wherever the request is found wanting.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace specdec::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type, std::string param = {}, std::string code = {});
  int status() const { return status_; }
  nlohmann::json body() const;

 private:
  int status_;
  std::string type_, param_, code_;
};

// 400 invalid_request_error naming the field at fault.
ApiError invalid_field(const std::string& param, const std::string& message);

// The error JSON for a status and message (param and code null).
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& param = {},
                          const std::string& code = {});

}  // namespace specdec::server
