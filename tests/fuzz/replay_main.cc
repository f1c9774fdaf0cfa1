// A main for a fuzzer's LLVMFuzzerTestOneInput in the normal (GCC) build: runs every file of the
// folders named on the command line once, in name order, then exits 0. The fuzzer's own checks
// trap on a finding, so a seed corpus that replays clean passes. Also `--max_inputs=N`: at most N
// files per folder (the first N by name), to keep a large corpus cheap.
#include <dirent.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// The regular files of `folder`, sorted; exits 2 when it cannot be read.
std::vector<std::string> FilesOf(const std::string& folder) {
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) {
    std::fprintf(stderr, "replay: cannot read folder %s\n", folder.c_str());
    std::exit(2);
  }
  std::vector<std::string> files;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") files.push_back(folder + "/" + name);
  }
  ::closedir(dir);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  size_t max_inputs = SIZE_MAX;
  std::vector<std::string> folders;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--max_inputs=", 0) == 0) {
      max_inputs = std::strtoull(arg.c_str() + 13, nullptr, 10);
    } else {
      folders.push_back(arg);
    }
  }
  if (folders.empty()) {
    std::fprintf(stderr, "usage: %s [--max_inputs=N] CORPUS_FOLDER...\n", argv[0]);
    return 2;
  }
  size_t replayed = 0;
  for (const std::string& folder : folders) {
    std::vector<std::string> files = FilesOf(folder);
    if (files.empty()) {
      std::fprintf(stderr, "replay: %s holds no input\n", folder.c_str());
      return 2;
    }
    if (files.size() > max_inputs) files.resize(max_inputs);
    for (const std::string& file : files) {
      std::ifstream in(file, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
  }
  std::printf("replay: %zu inputs, no finding\n", replayed);
  return 0;
}
