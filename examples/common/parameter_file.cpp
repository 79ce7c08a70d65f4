#include "parameter_file.h"

#include <c10/core/GradMode.h>
#include <torch/serialize.h>

#include <filesystem>
#include <fstream>

#include <sheaf/core/error.h>

namespace sheaf::models {

void save_parameters(const std::vector<at::Tensor>& params, const std::string& path) {
  std::vector<at::Tensor> ps;
  for (const at::Tensor& p : params) ps.push_back(p.detach().cpu());
  torch::save(ps, path);
}

void expect_writable(const std::string& path, const std::string& option) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw UserError(option + ": '" + path + "' is a folder");
  const bool existed = fs::exists(path, ec);
  if (!std::ofstream(path, std::ios::app))  // (append: an existing file is left as it is)
    throw UserError(option + ": cannot write '" + path + "' (does its folder exist? may it be written?)");
  if (!existed) fs::remove(path, ec);
}

void load_parameters(const std::vector<at::Tensor>& params, const std::string& path, const std::string& model) {
  copy_parameters(read_parameters(path, model), params, path, model);
}

std::vector<at::Tensor> read_parameters(const std::string& path, const std::string& model) {
  std::vector<at::Tensor> ps;
  try {
    torch::load(ps, path);
  } catch (const std::exception& e) {
    throw UserError(model + "::load: cannot read '" + path + "': " + e.what());
  }
  return ps;
}

void copy_parameters(const std::vector<at::Tensor>& ps, const std::vector<at::Tensor>& params,
                     const std::string& path, const std::string& model) {
  if (ps.size() != params.size())
    throw UserError(detail::cat(model, "::load: '", path, "' holds ", ps.size(), " tensors, a ", model, " has ",
                                params.size(), " (another model, or another option that adds parameters?)"));
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (ps[i].sizes() != params[i].sizes())
      throw UserError(detail::cat(model, "::load: parameter ", i, " in '", path, "' has shape ", ps[i].sizes(),
                                  ", the model has ", params[i].sizes(), " (different sizes or vocabulary?)"));
    at::Tensor(params[i]).copy_(ps[i]);
  }
}

}  // namespace sheaf::models
