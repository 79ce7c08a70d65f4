// Saving and loading a model's parameter list (torch::save of CPU copies),
// shared by the examples' models.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace sheaf::models {

void save_parameters(const std::vector<at::Tensor>& params, const std::string& path);

// Copies the file's tensors into `params` (in place, any device). A file that
// cannot be read, or holds another number or shape of tensors, is a UserError
// naming `model` and what differs.
void load_parameters(const std::vector<at::Tensor>& params, const std::string& path, const std::string& model);

// The file's tensors as saved; a UserError naming `model` if it cannot be read.
std::vector<at::Tensor> read_parameters(const std::string& path, const std::string& model);

// Copies `saved` (read from `path`) into `params`, after checking their number
// and shapes: the same UserErrors as load_parameters.
void copy_parameters(const std::vector<at::Tensor>& saved, const std::vector<at::Tensor>& params,
                     const std::string& path, const std::string& model);

// A UserError naming `option` now if `path` cannot be written (a missing
// folder, no permission, a folder by that name): found when the file is
// written, after training, it cost the whole run. Leaves no file behind.
void expect_writable(const std::string& path, const std::string& option);

}  // namespace sheaf::models
