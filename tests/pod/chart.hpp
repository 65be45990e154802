#pragma once
// The Helm chart as a cluster receives it: `helm template` with the test's
// values, parsed with yaml-cpp, and the lookups a kubelet makes when it
// starts a container of a rendered pod: ConfigMap and Secret keys (the
// rendered ones, and those the test creates as an operator would), and the
// container's environment built the way Kubernetes builds it.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace sagapool::test {

class Cluster {
 public:
  // Every document of `helm template --namespace NS RELEASE CHART -f VALUES`
  // (hooks included); throws with helm's output when it fails.
  static Cluster render(const std::filesystem::path& helm, const std::filesystem::path& chart,
                        const std::string& release, const std::string& ns,
                        const std::filesystem::path& values);

  // An object the operator creates beside the release (a Secret, say).
  void add(YAML::Node object);
  // The object of this kind and name; throws if there is none.
  YAML::Node get(const std::string& kind, const std::string& name) const;
  // Names of the objects of a kind, in rendering order.
  std::vector<std::string> names(const std::string& kind) const;

  // A key of a ConfigMap (data) or Secret (data, base64-decoded; or
  // stringData); throws if missing, as the kubelet refuses to start the pod.
  std::string config_map_value(const std::string& name, const std::string& key) const;
  std::string secret_value(const std::string& name, const std::string& key) const;

  // The environment of `container` (a Container object) in order: `value`
  // with $(VAR) references to earlier variables expanded ($$ is a literal
  // $, an unknown reference stays as written), `valueFrom` ConfigMap and
  // Secret keys, and metadata.name / metadata.namespace field references.
  std::vector<std::pair<std::string, std::string>> environment(const YAML::Node& container,
                                                               const std::string& pod_name) const;

  const std::string& ns() const { return ns_; }

 private:
  std::vector<YAML::Node> objects_;
  std::string ns_;
};

// $(VAR) expansion of Kubernetes (env values, command and args).
std::string expand_references(const std::string& text,
                              const std::vector<std::pair<std::string, std::string>>& env);

// A Kubernetes quantity in bytes ("64Mi", "1G", "512") and in CPUs ("250m",
// "1"); throws on what it cannot read.
std::int64_t quantity_bytes(const std::string& q);
double quantity_cpus(const std::string& q);

std::string base64_decode(const std::string& in);
std::string base64_encode(const std::string& in);

}  // namespace sagapool::test
