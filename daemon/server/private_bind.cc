#include "daemon/server/private_bind.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace kvrail::server {
namespace {

// Thread contract: see PrivateBind.
class PrivateBindImpl final : public PrivateBind {
 public:
  PrivateBindImpl(std::string dir, std::string final_path)
      : dir_(std::move(dir)), bind_path_(dir_ + "/s"), final_path_(std::move(final_path)) {}
  ~PrivateBindImpl() override {
    ::unlink(bind_path_.c_str());  // ENOENT once published
    ::rmdir(dir_.c_str());
  }
  const std::string& bind_path() const override { return bind_path_; }
  absl::Status Publish(uint32_t mode) override {
    if (::chmod(bind_path_.c_str(), mode) != 0) {
      return absl::InternalError(
          absl::StrCat("unix_socket: chmod ", bind_path_, ": ", strerror(errno)));
    }
    if (::rename(bind_path_.c_str(), final_path_.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("unix_socket: rename ", bind_path_, " to ",
                                              final_path_, ": ", strerror(errno)));
    }
    return absl::OkStatus();
  }

 private:
  const std::string dir_;
  const std::string bind_path_;
  const std::string final_path_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PrivateBind>> PrivateBind::Create(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string parent =
      slash == std::string::npos ? std::string(".") : (slash == 0 ? "" : path.substr(0, slash));
  std::string tmpl = absl::StrCat(parent, "/.kvrail-XXXXXX");
  if (tmpl.size() + 2 >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("unix_socket: the directory of ", path,
                                                   " is too long for a socket bound beside it"));
  }
  if (::mkdtemp(tmpl.data()) == nullptr) {  // mode 0700
    return absl::UnavailableError(
        absl::StrCat("unix_socket: cannot make a directory beside ", path, ": ", strerror(errno)));
  }
  return std::unique_ptr<PrivateBind>(new PrivateBindImpl(std::move(tmpl), path));
}

}  // namespace kvrail::server
