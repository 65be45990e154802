#include "chart.hpp"

#include <cmath>
#include <map>
#include <stdexcept>

#include "process.hpp"

namespace sagapool::test {

Cluster Cluster::render(const std::filesystem::path& helm, const std::filesystem::path& chart,
                        const std::string& release, const std::string& ns,
                        const std::filesystem::path& values) {
  // The manifests are helm's standard output; its notes on stderr are not YAML.
  TempDir dir("sagapool-helm");
  const RunResult r = run({"/bin/bash", "-c", "out=$1; shift; exec \"$@\" >\"$out\"", "helm", (dir / "manifests.yaml").string(),
                           helm.string(), "template", release, chart.string(), "--namespace", ns, "--values",
                           values.string()});
  if (r.exit_code != 0) throw std::runtime_error("helm template failed:\n" + r.output);
  const std::string manifests = read_file(dir / "manifests.yaml");
  Cluster cluster;
  cluster.ns_ = ns;
  for (YAML::Node doc : YAML::LoadAll(manifests)) {
    if (doc.IsMap() && doc["kind"]) cluster.objects_.push_back(doc);
  }
  if (cluster.objects_.empty()) throw std::runtime_error("helm template rendered no object:\n" + manifests);
  return cluster;
}

void Cluster::add(YAML::Node object) { objects_.push_back(std::move(object)); }

YAML::Node Cluster::get(const std::string& kind, const std::string& name) const {
  for (const YAML::Node& o : objects_) {
    if (o["kind"].as<std::string>() == kind && o["metadata"]["name"].as<std::string>() == name) return o;
  }
  throw std::runtime_error("no " + kind + " named " + name + " in the rendered chart or the test's objects");
}

std::vector<std::string> Cluster::names(const std::string& kind) const {
  std::vector<std::string> out;
  for (const YAML::Node& o : objects_) {
    if (o["kind"].as<std::string>() == kind) out.push_back(o["metadata"]["name"].as<std::string>());
  }
  return out;
}

std::string Cluster::config_map_value(const std::string& name, const std::string& key) const {
  const YAML::Node data = get("ConfigMap", name)["data"];
  if (!data || !data[key]) throw std::runtime_error("ConfigMap " + name + " has no key " + key);
  return data[key].as<std::string>();
}

std::string Cluster::secret_value(const std::string& name, const std::string& key) const {
  const YAML::Node secret = get("Secret", name);
  if (secret["stringData"] && secret["stringData"][key]) return secret["stringData"][key].as<std::string>();
  if (secret["data"] && secret["data"][key]) return base64_decode(secret["data"][key].as<std::string>());
  throw std::runtime_error("Secret " + name + " has no key " + key);
}

std::vector<std::pair<std::string, std::string>> Cluster::environment(const YAML::Node& container,
                                                                      const std::string& pod_name) const {
  std::vector<std::pair<std::string, std::string>> env;
  if (container["envFrom"]) throw std::runtime_error("envFrom is not modelled by this test");
  for (const YAML::Node& var : container["env"]) {
    const std::string name = var["name"].as<std::string>();
    std::string value;
    if (var["value"]) {
      value = expand_references(var["value"].as<std::string>(), env);
    } else if (const YAML::Node from = var["valueFrom"]) {
      if (from["secretKeyRef"]) {
        value = secret_value(from["secretKeyRef"]["name"].as<std::string>(),
                             from["secretKeyRef"]["key"].as<std::string>());
      } else if (from["configMapKeyRef"]) {
        value = config_map_value(from["configMapKeyRef"]["name"].as<std::string>(),
                                 from["configMapKeyRef"]["key"].as<std::string>());
      } else if (from["fieldRef"]) {
        const std::string path = from["fieldRef"]["fieldPath"].as<std::string>();
        if (path == "metadata.name") {
          value = pod_name;
        } else if (path == "metadata.namespace") {
          value = ns_;
        } else {
          throw std::runtime_error("env " + name + ": fieldRef " + path + " is not modelled by this test");
        }
      } else {
        throw std::runtime_error("env " + name + ": this kind of valueFrom is not modelled by this test");
      }
    }
    // A later entry of the same name replaces the earlier one (the last wins).
    std::erase_if(env, [&](const auto& kv) { return kv.first == name; });
    env.emplace_back(name, value);
  }
  return env;
}

std::string expand_references(const std::string& text,
                              const std::vector<std::pair<std::string, std::string>>& env) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 >= text.size()) {
      out += text[i];
      continue;
    }
    if (text[i + 1] == '$') {  // $$ is an escaped $
      out += '$';
      ++i;
      continue;
    }
    const std::size_t close = text[i + 1] == '(' ? text.find(')', i + 2) : std::string::npos;
    if (close == std::string::npos) {
      out += text[i];
      continue;
    }
    const std::string name = text.substr(i + 2, close - i - 2);
    auto it = env.end();
    for (auto e = env.begin(); e != env.end(); ++e) {
      if (e->first == name) it = e;
    }
    out += it == env.end() ? text.substr(i, close - i + 1) : it->second;
    i = close;
  }
  return out;
}

namespace {

std::pair<double, std::string> split_quantity(const std::string& q) {
  std::size_t used = 0;
  const double number = std::stod(q, &used);
  return {number, q.substr(used)};
}

}  // namespace

std::int64_t quantity_bytes(const std::string& q) {
  static const std::map<std::string, double> kUnits = {
      {"", 1},         {"k", 1e3},          {"M", 1e6},          {"G", 1e9},
      {"T", 1e12},     {"Ki", 1024.0},      {"Mi", 1048576.0},   {"Gi", 1073741824.0},
      {"Ti", 1099511627776.0}};
  const auto [number, unit] = split_quantity(q);
  const auto it = kUnits.find(unit);
  if (it == kUnits.end()) throw std::runtime_error("cannot read the quantity " + q);
  return static_cast<std::int64_t>(std::ceil(number * it->second));
}

double quantity_cpus(const std::string& q) {
  const auto [number, unit] = split_quantity(q);
  if (unit.empty()) return number;
  if (unit == "m") return number / 1000;
  throw std::runtime_error("cannot read the CPU quantity " + q);
}

namespace {
constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64_decode(const std::string& in) {
  std::string out;
  int bits = 0;
  unsigned value = 0;
  for (const char c : in) {
    if (c == '=' || c == '\n' || c == '\r' || c == ' ') continue;
    const char* at = std::char_traits<char>::find(kBase64, 64, c);
    if (at == nullptr) throw std::runtime_error("not base64: " + in);
    value = (value << 6) | static_cast<unsigned>(at - kBase64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((value >> bits) & 0xff);
    }
  }
  return out;
}

std::string base64_encode(const std::string& in) {
  std::string out;
  unsigned value = 0;
  int bits = 0;
  for (const char c : in) {
    value = (value << 8) | static_cast<unsigned char>(c);
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += kBase64[(value >> bits) & 63];
    }
  }
  if (bits > 0) out += kBase64[(value << (6 - bits)) & 63];
  while (out.size() % 4 != 0) out += '=';
  return out;
}

}  // namespace sagapool::test
