#include "core/config/loader.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/config/errors.h"
#include "core/config/schema.h"
#include "core/util/files.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "yaml-cpp/yaml.h"

namespace bigmac::config {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

template <typename T>
bool ParseNumber(const std::string& text, T* value) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (begin != end && *begin == '+') ++begin;
  auto [ptr, ec] = std::from_chars(begin, end, *value);
  return ec == std::errc() && ptr == end && begin != end;
}

std::string TypeName(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
      return "an integer";
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return "a number";
    case FieldDescriptor::CPPTYPE_BOOL:
      return "true or false";
    default:
      return "a string";
  }
}

// Stores one scalar `text` into `field` of `message` (appending if repeated). Returns "" or why
// not.
std::string StoreScalar(Message* message, const FieldDescriptor* field, const std::string& text) {
  const Reflection* reflection = message->GetReflection();
  const bool repeated = field->is_repeated();
  bool ok = true;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t value = 0;
      ok = ParseNumber(text, &value);
      if (int64_t wide = 0; !ok && ParseNumber(text, &wide)) {
        return "'" + text + "' is out of range for a 32-bit integer (" + std::to_string(INT32_MIN) +
               " to " + std::to_string(INT32_MAX) + ")";
      }
      if (ok)
        repeated ? reflection->AddInt32(message, field, value)
                 : reflection->SetInt32(message, field, value);
      break;
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t value = 0;
      ok = ParseNumber(text, &value);
      if (ok)
        repeated ? reflection->AddInt64(message, field, value)
                 : reflection->SetInt64(message, field, value);
      break;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double value = 0;
      ok = ParseNumber(text, &value);
      if (ok)
        repeated ? reflection->AddDouble(message, field, value)
                 : reflection->SetDouble(message, field, value);
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      ok = text == "true" || text == "false";
      if (ok)
        repeated ? reflection->AddBool(message, field, text == "true")
                 : reflection->SetBool(message, field, text == "true");
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING:
      // A line break or control character in a one-line value is a YAML quote left open (yaml-cpp
      // reads `"data` at the end of a file as the string "data\n"), never a real path or name.
      for (unsigned char c : text) {
        if (c < 0x20 || c == 0x7f) {
          return "the value holds a line break or control character (an unterminated quote?)";
        }
      }
      repeated ? reflection->AddString(message, field, text)
               : reflection->SetString(message, field, text);
      break;
    default:
      return "has a type the loader does not support";
  }
  if (!ok) return "expected " + TypeName(field) + ", got '" + text + "'";
  return "";
}

// The message that holds `key`'s leaf, created on the way down.
Message* LeafParent(Config* config, const KeyInfo& key) {
  Message* message = config;
  for (size_t i = 0; i + 1 < key.chain.size(); ++i) {
    message = message->GetReflection()->MutableMessage(message, key.chain[i]);
  }
  return message;
}

constexpr int kMaxFlowNesting = 32;

// The deepest nesting of [ ] and { } outside quoted strings and comments.
int FlowNestingDepth(const std::string& text) {
  int depth = 0;
  int deepest = 0;
  char quote = 0;
  bool comment = false;
  for (char c : text) {
    if (comment) {
      comment = c != '\n';
    } else if (quote) {
      if (c == quote || c == '\n') quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      comment = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// The deepest nesting of indented blocks: the enclosing indentation levels of a line, plus the
// "- " items that open on it. yaml-cpp guards its recursion with the message "bad file".
int BlockNestingDepth(const std::string& text) {
  std::vector<size_t> indents;
  int deepest = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    size_t at = line.find_first_not_of(' ');
    if (at == std::string::npos || line[at] == '#' || line[at] == '\r') continue;
    while (!indents.empty() && indents.back() >= at) indents.pop_back();
    indents.push_back(at);
    int dashes = 0;
    while (at + 1 < line.size() && line[at] == '-' && line[at + 1] == ' ') {
      ++dashes;
      at = line.find_first_not_of(' ', at + 1);
      if (at == std::string::npos) break;
    }
    deepest = std::max(deepest, static_cast<int>(indents.size()) + dashes);
  }
  return deepest;
}

// Whether `text` holds anything but blank lines and comments.
bool HasContent(const std::string& text) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first != std::string::npos && line[first] != '#') return true;
  }
  return false;
}

// The 1-based line where a second YAML document begins ("---" after content or after a first
// "---"), or 0 for a single document.
int SecondDocumentLine(const std::string& text) {
  std::istringstream lines(text);
  bool content = false;
  bool marker = false;
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const bool is_marker = line.rfind("---", 0) == 0 &&
                           (line.size() == 3 || std::isspace(static_cast<unsigned char>(line[3])));
    if (is_marker) {
      if (content || marker) return number;
      marker = true;
      continue;
    }
    const size_t first = line.find_first_not_of(" \t\r");
    if (first != std::string::npos && line[first] != '#') content = true;
  }
  return 0;
}

class Loader {
 public:
  explicit Loader(LoadedConfig* out) : out_(out), keys_(AllKeys()) {}

  void LoadFile(const std::string& file) {
    std::string text;
    if (std::string problem = util::ReadUserFile(file, kMaxConfigBytes, "config file", &text);
        !problem.empty()) {
      problems_.push_back(problem + (problem.find("too large") != std::string::npos
                                         ? " (a config is a few KiB: is this the right file?)"
                                         : ""));
      return;
    }
    if (!HasContent(text)) {
      // Every default (a 12-layer model, 100 steps) is not what anyone meant to train.
      problems_.push_back(file +
                          ": the config file is empty (or only comments); write at least the "
                          "model: and data: sections");
      return;
    }
    if (EndsWith(file, ".yaml") || EndsWith(file, ".yml")) {
      LoadYaml(file, text);
    } else if (EndsWith(file, ".textproto") || EndsWith(file, ".txtpb") ||
               EndsWith(file, ".pbtxt")) {
      LoadTextProto(file, text);
    } else {
      problems_.push_back(file +
                          ": unknown config format; use .yaml/.yml (YAML) or "
                          ".textproto/.txtpb/.pbtxt (protobuf text format)");
    }
  }

  void ApplyOverride(const std::string& assignment) {
    const size_t equals = assignment.find('=');
    if (equals == std::string::npos || equals == 0) {
      problems_.push_back("--set '" + assignment +
                          "': expected key=value, e.g. --set parallel.pp_size=4");
      return;
    }
    const std::string path = assignment.substr(0, equals);
    const std::string value_text = assignment.substr(equals + 1);
    const std::string where = "--set " + path;
    const KeyInfo* key = FindKey(keys_, path);
    if (!key) {
      problems_.push_back(where + ": " + ExplainUnknownKey(keys_, path));
      return;
    }
    if (key->layer == LAUNCH) {
      problems_.push_back(where + ": " + LaunchKeyRule(*key));
      return;
    }
    YAML::Node value;
    try {
      // `--set train.output_dir=` is the empty string the help offers ("empty: not written"); YAML
      // would read nothing as null.
      const bool empty_string =
          value_text.empty() && key->field()->type() == FieldDescriptor::TYPE_STRING;
      value = YAML::Load(empty_string ? "\"\"" : value_text);
    } catch (const YAML::Exception& e) {
      problems_.push_back(where + ": cannot parse value '" + value_text + "': " + e.msg);
      return;
    }
    SetLeaf(*key, value, where, Source::Override());
  }

  // Launch-layer keys: the variable the launcher set, if any (an empty one counts as unset).
  void ApplyLaunchEnvironment(const LaunchEnv& env) {
    for (const KeyInfo& key : keys_) {
      if (key.layer != LAUNCH || key.env.empty()) continue;
      const char* text = env ? env(key.env.c_str()) : nullptr;
      if (text == nullptr || *text == '\0') continue;
      Message* parent = LeafParent(&out_->values, key);
      if (std::string error = StoreScalar(parent, key.field(), text); !error.empty()) {
        problems_.push_back(key.env + "=" + text + " (launch, for " + key.path + "): " + error);
        continue;
      }
      out_->sources.Set(key.path, Source::Launch(key.env));
    }
  }

  std::vector<std::string>& problems() { return problems_; }

 private:
  void LoadYaml(const std::string& file, const std::string& text) {
    // yaml-cpp parses flow collections recursively: bound the depth before it sees the text.
    if (const int depth = FlowNestingDepth(text); depth > kMaxFlowNesting) {
      problems_.push_back(file + ": YAML syntax error: [ and { nest " + std::to_string(depth) +
                          " levels deep (at most " + std::to_string(kMaxFlowNesting) +
                          "); a config is a few flat sections");
      return;
    }
    if (const int depth = BlockNestingDepth(text); depth > kMaxFlowNesting) {
      problems_.push_back(file + ": YAML syntax error: indented blocks nest " +
                          std::to_string(depth) + " levels deep (at most " +
                          std::to_string(kMaxFlowNesting) + "); a config is a few flat sections");
      return;
    }
    yaml_lines_.clear();
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) yaml_lines_.push_back(line);
    if (const int line = SecondDocumentLine(text); line > 0) {
      problems_.push_back(file + ":" + std::to_string(line) +
                          ": a second YAML document starts here (---); a config is one document");
      return;
    }
    YAML::Node root;
    try {
      // Not YAML::LoadAll: yaml-cpp 0.7's loops forever on inputs such as "," (found by
      // tests/fuzz; the input is a seed there).
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      problems_.push_back(file + ":" + std::to_string(e.mark.line + 1) +
                          ": YAML syntax error: " + e.msg);
      return;
    }
    // Content that reads as null is not a config (yaml-cpp reads a stray "," that way).
    if (!root.IsMap()) {
      problems_.push_back(file +
                          ": expected a mapping of sections (parallel:, train:, model:, ...)");
      return;
    }
    WalkYamlMap(file, root, "");
  }

  void WalkYamlMap(const std::string& file, const YAML::Node& map, const std::string& prefix) {
    std::map<std::string, int> seen_at_line;
    for (const auto& entry : map) {
      const int line = entry.first.Mark().line + 1;
      const std::string where = file + ":" + std::to_string(line);
      if (!entry.first.IsScalar()) {
        problems_.push_back(where + ": keys must be plain names");
        continue;
      }
      const std::string path = prefix + entry.first.Scalar();
      if (auto [it, inserted] = seen_at_line.emplace(path, line); !inserted) {
        problems_.push_back(where + ": '" + path + "' is written twice (first at line " +
                            std::to_string(it->second) + "); keep one");
        continue;
      }
      if (const KeyInfo* key = FindKey(keys_, path); key && key->layer == LAUNCH) {
        problems_.push_back(where + ": " + LaunchKeyRule(*key));
      } else if (key) {
        if (std::string open = UnclosedQuote(entry.second); !open.empty()) {
          problems_.push_back(file + ":" + open + ": " + path +
                              ": a quoted value must close on its line (an unterminated quote?)");
          continue;
        }
        SetLeaf(*key, entry.second, where + ": " + path, Source::File(file, line));
      } else if (IsSection(path)) {
        if (entry.second.IsMap()) {
          WalkYamlMap(file, entry.second, path + ".");
        } else if (!entry.second.IsNull()) {
          problems_.push_back(where + ": '" + path + "' is a section; write its keys under it");
        }
      } else {
        problems_.push_back(where + ": " + ExplainUnknownKey(keys_, path));
      }
    }
  }

  // "LINE" of the first scalar in `value` (itself or its list items) that opens a quote the line
  // does not close, or "". yaml-cpp folds `dir: "data` at the end of a file into "data "; a config
  // has no multi-line strings, so a quote left open is a mistake, not a value.
  std::string UnclosedQuote(const YAML::Node& value) const {
    std::vector<YAML::Node> scalars;
    if (value.IsScalar()) scalars.push_back(value);
    if (value.IsSequence()) {
      for (const YAML::Node& item : value) {
        if (item.IsScalar()) scalars.push_back(item);
      }
    }
    for (const YAML::Node& scalar : scalars) {
      const YAML::Mark mark = scalar.Mark();
      if (mark.line < 0 || mark.line >= static_cast<int>(yaml_lines_.size())) continue;
      const std::string& text = yaml_lines_[mark.line];
      if (mark.column < 0 || mark.column >= static_cast<int>(text.size())) continue;
      const char quote = text[mark.column];
      if (quote != '"' && quote != '\'') continue;
      size_t at = mark.column + 1;
      bool closed = false;
      while (at < text.size()) {
        if (quote == '"' && text[at] == '\\') {
          at += 2;
          continue;
        }
        if (text[at] == quote) {
          if (quote == '\'' && at + 1 < text.size() && text[at + 1] == '\'') {
            at += 2;  // '' is an escaped quote inside single quotes
            continue;
          }
          closed = true;
          break;
        }
        ++at;
      }
      if (!closed) return std::to_string(mark.line + 1);
    }
    return "";
  }

  bool IsSection(const std::string& path) const {
    for (const KeyInfo& key : keys_) {
      if (key.path.rfind(path + ".", 0) == 0) return true;
    }
    return false;
  }

  void SetLeaf(const KeyInfo& key, const YAML::Node& value, const std::string& where,
               Source source) {
    Message* parent = LeafParent(&out_->values, key);
    const FieldDescriptor* field = key.field();
    if (!value.IsDefined() || value.IsNull()) {
      problems_.push_back(where + ": no value given");
      return;
    }
    if (field->is_repeated()) {
      // data.path may be one string of space-separated items, as Megatron's command line has
      // them (data.path=0.3 web 0.7 code is --data-path 0.3 web 0.7 code). Only there: a
      // plugin's path may hold a space.
      if (value.IsScalar() && key.path == "data.path") {
        parent->GetReflection()->ClearField(parent, field);
        std::istringstream items(value.Scalar());
        for (std::string item; items >> item;) {
          if (std::string error = StoreScalar(parent, field, item); !error.empty()) {
            problems_.push_back(where + ": " + error);
            return;
          }
        }
        out_->sources.Set(key.path, std::move(source));
        return;
      }
      if (!value.IsSequence()) {
        problems_.push_back(where + ": expected a list like [7, 7, 7, 6], got '" +
                            (value.IsScalar() ? value.Scalar() : std::string("a mapping")) + "'");
        return;
      }
      parent->GetReflection()->ClearField(parent, field);
      for (const YAML::Node& item : value) {
        if (!item.IsScalar()) {
          problems_.push_back(where + ": list items must be plain values");
          return;
        }
        if (std::string error = StoreScalar(parent, field, item.Scalar()); !error.empty()) {
          problems_.push_back(where + ": " + error);
          return;
        }
      }
    } else {
      if (!value.IsScalar()) {
        problems_.push_back(where + ": expected a single value (" + TypeName(field) + "), got a " +
                            (value.IsSequence() ? "list" : "mapping"));
        return;
      }
      if (std::string error = StoreScalar(parent, field, value.Scalar()); !error.empty()) {
        problems_.push_back(where + ": " + error);
        return;
      }
    }
    out_->sources.Set(key.path, std::move(source));
  }

  // protobuf's text parser reports unknown fields itself; this rewrites them in our terms.
  class TextErrors : public google::protobuf::io::ErrorCollector {
   public:
    TextErrors(const Loader* loader, std::string file) : loader_(loader), file_(std::move(file)) {}
    void AddError(int line, google::protobuf::io::ColumnNumber,
                  const std::string& message) override {
      messages.push_back(file_ + ":" + std::to_string(line + 1) + ": " +
                         loader_->Translate(message));
    }
    std::vector<std::string> messages;

   private:
    const Loader* loader_;
    std::string file_;
  };

  // 'Message type "bigmac.config.Parallel" has no field named "dp_size".' -> our explanation.
  std::string Translate(const std::string& message) const {
    const std::string marker = "has no field named \"";
    const size_t field_at = message.find(marker);
    const size_t type_at = message.find('"');
    if (field_at == std::string::npos || type_at == std::string::npos) return message;
    const std::string type =
        message.substr(type_at + 1, message.find('"', type_at + 1) - type_at - 1);
    const size_t name_start = field_at + marker.size();
    const std::string name = message.substr(name_start, message.find('"', name_start) - name_start);
    return ExplainUnknownKey(keys_, SectionPrefix(type) + name);
  }

  std::string SectionPrefix(const std::string& message_type) const {
    for (const KeyInfo& key : keys_) {
      std::string prefix;
      for (const FieldDescriptor* field : key.chain) {
        if (field->containing_type()->full_name() == message_type) return prefix;
        prefix += field->name() + ".";
      }
    }
    return "";
  }

  void LoadTextProto(const std::string& file, const std::string& text) {
    google::protobuf::TextFormat::Parser parser;
    google::protobuf::TextFormat::ParseInfoTree locations;
    TextErrors errors(this, file);
    parser.RecordErrorsTo(&errors);
    parser.WriteLocationsTo(&locations);
    Config parsed;
    if (!parser.ParseFromString(text, &parsed)) {
      problems_.insert(problems_.end(), errors.messages.begin(), errors.messages.end());
      if (errors.messages.empty())
        problems_.push_back(file + ": cannot parse as protobuf text format");
      return;
    }
    out_->values.MergeFrom(parsed);
    for (const KeyInfo& key : keys_) {
      const google::protobuf::TextFormat::ParseInfoTree* tree = &locations;
      const Message* message = &parsed;
      bool present = true;
      for (size_t i = 0; i + 1 < key.chain.size() && present; ++i) {
        present = message->GetReflection()->HasField(*message, key.chain[i]);
        if (!present) break;
        message = &message->GetReflection()->GetMessage(*message, key.chain[i]);
        tree = tree ? tree->GetTreeForNested(key.chain[i], -1) : nullptr;
      }
      if (!present) continue;
      const FieldDescriptor* field = key.field();
      const Reflection* reflection = message->GetReflection();
      if (field->is_repeated() ? reflection->FieldSize(*message, field) == 0
                               : !reflection->HasField(*message, field)) {
        continue;
      }
      const int line = tree ? tree->GetLocation(field, field->is_repeated() ? 0 : -1).line + 1 : 0;
      if (key.layer == LAUNCH) {
        problems_.push_back(file + ":" + std::to_string(line) + ": " + LaunchKeyRule(key));
        continue;
      }
      out_->sources.Set(key.path, Source::File(file, line));
    }
  }

  LoadedConfig* out_;
  std::vector<KeyInfo> keys_;
  std::vector<std::string> problems_;
  std::vector<std::string> yaml_lines_;  // the YAML file being loaded, for UnclosedQuote
};

}  // namespace

LoadedConfig LoadConfig(const std::string& file, const std::vector<std::string>& overrides) {
  return LoadConfig(file, overrides, [](const char* name) { return std::getenv(name); });
}

LoadedConfig LoadConfig(const std::string& file, const std::vector<std::string>& overrides,
                        const LaunchEnv& env) {
  LoadedConfig loaded;
  loaded.file = file;
  loaded.overrides = overrides;
  Loader loader(&loaded);
  if (!file.empty()) loader.LoadFile(file);
  for (const std::string& assignment : overrides) loader.ApplyOverride(assignment);
  loader.ApplyLaunchEnvironment(env);
  if (!loader.problems().empty()) throw ConfigError(std::move(loader.problems()));
  return loaded;
}

std::string PrecedenceLine(const LoadedConfig& loaded) {
  std::string line = "default";
  if (!loaded.file.empty()) line += " < " + loaded.file;
  line += " < --set";
  if (!loaded.overrides.empty()) {
    line += " (" + std::to_string(loaded.overrides.size()) +
            (loaded.overrides.size() == 1 ? " override)" : " overrides)");
  }
  return line + "; later wins";
}

}  // namespace bigmac::config
