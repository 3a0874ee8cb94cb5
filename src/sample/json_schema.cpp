#include "sample/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lode::sample {

using json = nlohmann::json;
using Node = JsonSchema::Node;
using Kind = Node::Kind;

namespace {

bool whitespace(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool starts_number(unsigned char c) { return c == '-' || (c >= '0' && c <= '9'); }

// Keywords that describe and do not constrain: read past.
const std::set<std::string> kAnnotations = {"title",   "description", "examples", "default",  "$schema",
                                            "$id",     "$comment",    "deprecated", "readOnly", "writeOnly",
                                            "$defs",   "definitions"};

// The bytes a value of this node can begin with.
std::array<bool, 256> first_bytes(const JsonSchema& schema, int32_t i) {
  std::array<bool, 256> b{};
  const Node& n = schema.node(i);
  switch (n.kind) {
    case Kind::any: b.fill(true); break;
    case Kind::any_object:
    case Kind::object: b['{'] = true; break;
    case Kind::array: b['['] = true; break;
    case Kind::string: b['"'] = true; break;
    case Kind::number:
    case Kind::integer:
      for (int c = 0; c < 256; ++c) b[size_t(c)] = starts_number(static_cast<unsigned char>(c));
      break;
    case Kind::literals:
      for (const std::string& t : n.texts) b[static_cast<unsigned char>(t[0])] = true;
      break;
    case Kind::choice:
      for (int32_t branch : n.values) {
        const std::array<bool, 256> o = first_bytes(schema, branch);
        for (size_t c = 0; c < 256; ++c) b[c] = b[c] || o[c];
      }
      break;
  }
  return b;
}

}  // namespace

// A name as a JSON pointer's token: '~' as "~0", '/' as "~1".
std::string pointer_token(const std::string& name) {
  std::string out;
  for (char c : name) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

// Compiles a schema document into nodes, node 0 the root; $refs resolve against the document.
class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json& document) : document_(document) {}

  std::shared_ptr<const JsonSchema> run() {
    out_.nodes_.emplace_back();  // the root's place
    compile_into(JsonSchema::kRoot, document_, "");
    const Kind root = out_.nodes_[0].kind;
    if (root == Kind::any) out_.nodes_[0].kind = Kind::any_object;
    else if (root != Kind::object && root != Kind::any_object) refuse("", "the root must be an object (type \"object\")");
    for (size_t i = 0; i < out_.nodes_.size(); ++i) {  // (once: a choice's value start reads them)
      const std::array<bool, 256> first = first_bytes(out_, int32_t(i));
      for (size_t c = 0; c < 256; ++c) out_.nodes_[i].first[c] = first[c];
    }
    return std::make_shared<const JsonSchema>(std::move(out_));
  }

 private:
  [[noreturn]] void refuse(const std::string& where, const std::string& what) const {
    fail("response_format json_schema: {} (at \"{}\"); lode constrains replies to types, properties, required, "
         "items, minItems, maxItems, enum, const, anyOf/oneOf of distinct kinds and $ref",
         what, where.empty() ? "#" : "#" + where);
  }

  int32_t add() {
    out_.nodes_.emplace_back();
    return int32_t(out_.nodes_.size() - 1);
  }

  // The node a schema compiles to, made for it (or the one a $ref already has).
  int32_t compile(const json& s, const std::string& where) {
    if (s.is_object() && s.contains("$ref")) return reference(s, where);
    const int32_t i = add();
    compile_into(i, s, where);
    return i;
  }

  int32_t reference(const json& s, const std::string& where) {
    for (const auto& [key, value] : s.items())
      if (key != "$ref" && !kAnnotations.count(key)) refuse(where + "/" + key, "a $ref with keywords beside it");
    if (!s["$ref"].is_string()) refuse(where + "/$ref", "$ref must be a string");
    const std::string ref = s["$ref"];
    if (const auto known = refs_.find(ref); known != refs_.end()) return known->second;
    if (ref.empty() || ref[0] != '#') refuse(where + "/$ref", fmt::format("$ref \"{}\" is not within this schema", ref));
    json::json_pointer pointer;
    try {
      pointer = json::json_pointer(ref.substr(1));
    } catch (const json::exception&) {
      refuse(where + "/$ref", fmt::format("$ref \"{}\" is not a JSON pointer", ref));
    }
    if (!document_.contains(pointer)) refuse(where + "/$ref", fmt::format("$ref \"{}\" points at nothing", ref));
    if (ref == "#") return refs_[ref] = JsonSchema::kRoot;
    const int32_t i = add();
    refs_[ref] = i;  // (before its body: the body may refer back)
    compile_into(i, document_.at(pointer), ref.substr(1));
    return i;
  }

  void compile_into(int32_t i, const json& s, const std::string& where) {
    if (++depth_ > kMaxNesting) refuse(where, fmt::format("schemas nested more than {} deep", kMaxNesting));
    compiling_.insert(i);
    body(i, s, where);
    compiling_.erase(i);
    --depth_;
  }

  // Whether node `n`'s kind is not known yet: still being compiled, and not an object or array
  // (whose kind is set before their properties and items are compiled).
  bool unknown(int32_t n) const { return compiling_.count(n) && out_.nodes_[size_t(n)].kind == Kind::any; }

  // Node i as node `from` (a schema that is another one under a $ref, a choice of one branch): a
  // copy where `from` is whole, else a choice of that one branch, which reads it once it is;
  // refused where `from`'s kind is not known yet (a $ref that reaches itself through $refs, allOf
  // and anyOf alone, with no object or array between).
  void same_as(int32_t i, int32_t from, const std::string& where) {
    if (unknown(from)) refuse(where, "a $ref that refers to itself with no object or array between");
    if (!compiling_.count(from)) return set(i, Node(out_.nodes_[size_t(from)]));
    Node alias;
    alias.kind = Kind::choice, alias.values = {from};
    set(i, std::move(alias));
  }

  void body(int32_t i, const json& s, const std::string& where) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) refuse(where, "the schema false accepts nothing");
      return;  // true: any value
    }
    if (!s.is_object()) refuse(where, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items())
      if (!kAnnotations.count(key) && !kKnown.count(key)) refuse(where + "/" + key, fmt::format("'{}' is not enforced", key));
    if (s.contains("$ref")) {  // (only at the document's root, whose place is taken: copy what it refers to)
      return same_as(i, reference(s, where), where);
    }
    if (s.contains("enum") || s.contains("const")) return literals(i, s, where);
    if (s.contains("allOf")) return all_of(i, s, where);
    if (s.contains("anyOf") || s.contains("oneOf")) return any_of(i, s, where);
    if (!s.contains("type")) {  // an object's or an array's keywords: that kind (a valid reply either way)
      const bool object_words = s.contains("properties") || s.contains("required") || s.contains("additionalProperties");
      const bool array_words = s.contains("items") || s.contains("minItems") || s.contains("maxItems");
      if (object_words && array_words) refuse(where, "an object's and an array's keywords with no type");
      if (object_words) return object(i, s, where);
      if (array_words) return array(i, s, where);
      return;  // any value
    }
    const json& type = s["type"];
    if (type.is_string()) return typed(i, type.get<std::string>(), s, where);
    if (!type.is_array() || type.empty()) refuse(where + "/type", "type must be a name or a list of them");
    std::vector<int32_t> branches;
    for (const json& t : type) {
      if (!t.is_string()) refuse(where + "/type", "type must be a name or a list of them");
      const int32_t b = add();
      typed(b, t.get<std::string>(), s, where);
      branches.push_back(b);
    }
    choice(i, branches, where);
  }

  void set(int32_t i, Node n) { out_.nodes_[size_t(i)] = std::move(n); }

  void typed(int32_t i, const std::string& type, const json& s, const std::string& where) {
    Node n;
    if (type == "object") return object(i, s, where);
    if (type == "array") return array(i, s, where);
    if (type == "string") n.kind = Kind::string;
    else if (type == "number") n.kind = Kind::number;
    else if (type == "integer") n.kind = Kind::integer;
    else if (type == "boolean") n.kind = Kind::literals, n.texts = {"true", "false"};
    else if (type == "null") n.kind = Kind::literals, n.texts = {"null"};
    else refuse(where + "/type", fmt::format("unknown type \"{}\"", type));
    set(i, std::move(n));
  }

  void object(int32_t i, const json& s, const std::string& where) {
    const json* properties = s.contains("properties") ? &s["properties"] : nullptr;
    if (properties && !properties->is_object()) refuse(where + "/properties", "properties must be an object");
    if (!properties || properties->empty()) {
      if (s.contains("required") && !s["required"].empty()) refuse(where + "/required", "required names no property");
      const json* more = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
      if (more && !more->is_boolean() && *more != json::object())
        refuse(where + "/additionalProperties", "additionalProperties as a schema is not enforced (name the properties)");
      const bool none = more && *more == false;
      Node n;  // any object, or {} only
      n.kind = none ? Kind::object : Kind::any_object;
      return set(i, std::move(n));
    }
    if (properties->size() > JsonSchema::kMaxProperties)
      refuse(where + "/properties", fmt::format("more than {} properties", JsonSchema::kMaxProperties));
    Node n;
    n.kind = Kind::object;
    for (const auto& [name, schema] : properties->items()) {
      n.keys.push_back(json(name).dump());
      n.values.push_back(-1);
    }
    if (s.contains("required")) {
      const json& required = s["required"];
      if (!required.is_array()) refuse(where + "/required", "required must be a list of names");
      for (const json& r : required) {
        const auto at = r.is_string() ? std::find(n.keys.begin(), n.keys.end(), r.dump()) : n.keys.end();
        if (at == n.keys.end()) refuse(where + "/required", fmt::format("required {} is not among the properties", r.dump()));
        n.required |= uint64_t(1) << (at - n.keys.begin());
      }
    }
    set(i, n);
    size_t k = 0;
    for (const auto& [name, schema] : properties->items()) {
      const int32_t v = compile(schema, where + "/properties/" + pointer_token(name));
      out_.nodes_[size_t(i)].values[k++] = v;
    }
  }

  void array(int32_t i, const json& s, const std::string& where) {
    if (s.contains("prefixItems")) refuse(where + "/prefixItems", "'prefixItems' is not enforced");
    Node n;
    n.kind = Kind::array;
    const auto bound = [&](const char* key, int64_t fallback) {
      if (!s.contains(key)) return fallback;
      if (!s[key].is_number_unsigned()) refuse(where + "/" + key, fmt::format("{} must be a whole number", key));
      return int64_t(std::min<uint64_t>(s[key].get<uint64_t>(), uint64_t(1) << 31));
    };
    n.min_items = bound("minItems", 0), n.max_items = bound("maxItems", -1);
    if (n.max_items >= 0 && n.max_items < n.min_items) refuse(where, "maxItems is below minItems");
    set(i, n);
    const int32_t items = s.contains("items") ? compile(s["items"], where + "/items") : add();  // (none: any)
    out_.nodes_[size_t(i)].items = items;
  }

  // enum and const: their values, of `type` where it is given (nothing else beside them).
  void literals(int32_t i, const json& s, const std::string& where) {
    for (const auto& [key, value] : s.items())
      if (key != "enum" && key != "const" && key != "type" && !kAnnotations.count(key))
        refuse(where + "/" + key, "enum or const with keywords beside it other than type");
    Node n;
    n.kind = Kind::literals;
    if (s.contains("const")) n.texts.push_back(s["const"].dump());
    if (s.contains("enum")) {
      const json& values = s["enum"];
      if (!values.is_array() || values.empty()) refuse(where + "/enum", "enum must be a list of values");
      std::vector<std::string> texts;
      for (const json& v : values) texts.push_back(v.dump());
      if (n.texts.empty()) n.texts = texts;
      else if (std::find(texts.begin(), texts.end(), n.texts[0]) == texts.end()) refuse(where, "const is not in enum");
    }
    if (s.contains("type")) {
      std::erase_if(n.texts, [&](const std::string& text) { return !of_type(json::parse(text), s["type"], where); });
      if (n.texts.empty()) refuse(where, "no value of enum or const is of its type");
    }
    std::sort(n.texts.begin(), n.texts.end());
    n.texts.erase(std::unique(n.texts.begin(), n.texts.end()), n.texts.end());
    if (n.texts.size() > JsonSchema::kMaxLiterals)
      refuse(where + "/enum", fmt::format("more than {} values", JsonSchema::kMaxLiterals));
    set(i, std::move(n));
  }

  // Whether a value is of a type (a name or a list of them), as JSON Schema counts types.
  bool of_type(const json& v, const json& type, const std::string& where) const {
    if (type.is_array()) return std::any_of(type.begin(), type.end(), [&](const json& t) { return of_type(v, t, where); });
    if (!type.is_string()) refuse(where + "/type", "type must be a name or a list of them");
    const std::string t = type;
    if (t == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
    if (t == "number") return v.is_number();
    if (t == "string") return v.is_string();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    refuse(where + "/type", fmt::format("unknown type \"{}\"", t));
  }

  void all_of(int32_t i, const json& s, const std::string& where) {
    const json& all = s["allOf"];
    if (!all.is_array() || all.size() != 1) refuse(where + "/allOf", "allOf of more than one schema");
    for (const auto& [key, value] : s.items())
      if (key != "allOf" && !kAnnotations.count(key)) refuse(where + "/" + key, "allOf with keywords beside it");
    if (all[0].is_object() && all[0].contains("$ref")) return same_as(i, reference(all[0], where + "/allOf/0"), where);
    compile_into(i, all[0], where + "/allOf/0");
  }

  void any_of(int32_t i, const json& s, const std::string& where) {
    const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
    const json& branches = s[key];
    if (!branches.is_array() || branches.empty()) refuse(where + "/" + key, fmt::format("{} must be a list", key));
    for (const auto& [k, value] : s.items())
      if (k != key && !kAnnotations.count(k)) refuse(where + "/" + k, fmt::format("{} with keywords beside it", key));
    std::vector<int32_t> nodes;
    for (size_t b = 0; b < branches.size(); ++b) nodes.push_back(compile(branches[b], where + "/" + key + "/" + std::to_string(b)));
    choice(i, nodes, where, std::string(key) == "oneOf");
  }

  // Branches that begin with different bytes, so that a value's first byte picks one; literals
  // merged, a number and an integer a number, any branch of any value the whole. With `one`
  // (oneOf), no value may be of two branches: overlapping literals, a number beside an integer and
  // a branch of any value beside others are refused rather than merged.
  void choice(int32_t i, const std::vector<int32_t>& branches, const std::string& where, bool one = false) {
    const auto overlap = [&] { refuse(where, "oneOf whose branches a value can match two of"); };
    Node n;
    n.kind = Kind::choice;
    Node merged;
    merged.kind = Kind::literals;
    int32_t number = -1;
    for (int32_t b : branches) {
      if (unknown(b)) refuse(where, "anyOf or oneOf with a $ref back to a schema that is no object or array yet");
      const Node& branch = out_.nodes_[size_t(b)];
      if (branch.kind == Kind::any) {
        if (one && branches.size() > 1) overlap();
        return set(i, Node{});
      }
      if (branch.kind == Kind::literals) {
        merged.texts.insert(merged.texts.end(), branch.texts.begin(), branch.texts.end());
      } else if (branch.kind == Kind::number || branch.kind == Kind::integer) {
        if (one && number >= 0) overlap();
        if (number < 0 || branch.kind == Kind::number) number = b;
      } else {
        n.values.push_back(b);
      }
    }
    if (number >= 0) n.values.push_back(number);
    if (!merged.texts.empty()) {
      std::sort(merged.texts.begin(), merged.texts.end());
      const size_t all = merged.texts.size();
      merged.texts.erase(std::unique(merged.texts.begin(), merged.texts.end()), merged.texts.end());
      if (one && merged.texts.size() < all) overlap();
      if (merged.texts.size() > JsonSchema::kMaxLiterals)
        refuse(where, fmt::format("more than {} values in its branches' enums together", JsonSchema::kMaxLiterals));
      const int32_t m = add();
      set(m, std::move(merged));
      n.values.push_back(m);
    }
    std::array<int, 256> claimed{};
    for (int32_t b : n.values) {
      const std::array<bool, 256> first = first_bytes(out_, b);
      for (size_t c = 0; c < 256; ++c)
        if (first[c] && claimed[c]++) refuse(where, "anyOf, oneOf or a list of types whose branches can begin alike");
    }
    if (n.values.size() == 1) return same_as(i, n.values[0], where);
    set(i, std::move(n));
  }

  static inline const std::set<std::string> kKnown = {"type",  "properties", "required", "additionalProperties",
                                                      "items", "minItems",   "maxItems", "enum",
                                                      "const", "anyOf",      "oneOf",    "allOf",
                                                      "$ref"};
  static constexpr int kMaxNesting = 64;  // schemas within schemas (the compiler recurses)
  const json& document_;
  JsonSchema out_;
  std::map<std::string, int32_t> refs_;
  std::set<int32_t> compiling_;
  int depth_ = 0;
};

std::shared_ptr<const JsonSchema> JsonSchema::compile(const json& schema) { return SchemaCompiler(schema).run(); }

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  static const std::shared_ptr<const JsonSchema> any = compile(json{{"type", "object"}});
  return any;
}

// ---- SchemaPrefix

SchemaPrefix::SchemaPrefix(const JsonSchema& schema) : schema_(&schema) {}

bool SchemaPrefix::push(char c) {
  const SchemaPrefix before = *this;
  if (push_byte(static_cast<unsigned char>(c))) return true;
  *this = before;
  return false;
}

bool SchemaPrefix::push(std::string_view bytes) {
  for (char c : bytes)
    if (!push_byte(static_cast<unsigned char>(c))) return false;
  return true;
}

bool SchemaPrefix::in_string() const {
  if (mode_ != Mode::scalar || !scalar_.in_string()) return false;
  const Kind k = node(value_node_).kind;
  return k == Kind::string || k == Kind::any || k == Kind::any_object;
}

bool SchemaPrefix::push_byte(unsigned char c) {
  switch (mode_) {
    case Mode::done: return false;
    case Mode::value: return start_value(c);
    case Mode::literal: return literal_byte(c);
    case Mode::scalar: return scalar_byte(c);
    case Mode::structure: return structure_byte(c);
  }
  return false;
}

bool SchemaPrefix::whitespace_here() {
  return whitespace_run_ < JsonPrefix::kMaxWhitespaceRun && (++whitespace_run_, true);
}

uint64_t SchemaPrefix::matching(const std::vector<std::string>& texts, uint64_t among, unsigned char c) const {
  uint64_t out = 0;
  for (uint64_t rest = among; rest; rest &= rest - 1) {
    const int t = std::countr_zero(rest);
    const std::string& text = texts[size_t(t)];
    if (offset_ < text.size() && static_cast<unsigned char>(text[offset_]) == c) out |= uint64_t(1) << t;
  }
  return out;
}

bool SchemaPrefix::start_value(unsigned char c) {
  if (whitespace(c)) return whitespace_here();
  whitespace_run_ = 0;
  while (node(value_node_).kind == Kind::choice) {  // the branch this byte begins
    const std::vector<int32_t>& branches = node(value_node_).values;
    const auto b = std::find_if(branches.begin(), branches.end(), [&](int32_t b) { return node(b).first[c]; });
    if (b == branches.end()) return false;
    value_node_ = *b;
  }
  const Node& n = node(value_node_);
  switch (n.kind) {
    case Kind::object: return c == '{' && open(value_node_, At::key_or_close);
    case Kind::array: return c == '[' && open(value_node_, At::item_or_close);
    case Kind::literals: {
      offset_ = 0;
      const uint64_t all = n.texts.size() >= 64 ? ~uint64_t(0) : (uint64_t(1) << n.texts.size()) - 1;
      candidates_ = matching(n.texts, all, c);
      if (!candidates_) return false;
      mode_ = Mode::literal, offset_ = 1;
      if (literal_whole()) end_value();
      return true;
    }
    case Kind::any_object:
      if (c != '{') return false;
      break;
    case Kind::string:
      if (c != '"') return false;
      break;
    case Kind::number:
    case Kind::integer:
      if (!starts_number(c)) return false;
      break;
    case Kind::any:
    case Kind::choice: break;
  }
  scalar_ = JsonPrefix::any_value();
  mode_ = Mode::scalar;
  if (!scalar_.push(char(c))) return false;
  if (scalar_.complete()) end_value();
  return true;
}

bool SchemaPrefix::literal_whole() const {
  const std::vector<std::string>& texts = node(value_node_).texts;
  for (uint64_t rest = candidates_; rest; rest &= rest - 1)
    if (texts[size_t(std::countr_zero(rest))].size() != offset_) return false;
  return true;
}

// A literal ends with its last byte where no other still matching goes on (a string, true, a
// list); a number that another goes on from ("1" and "12") ends at the byte after it, which the
// value's container then reads.
bool SchemaPrefix::literal_byte(unsigned char c) {
  const uint64_t next = matching(node(value_node_).texts, candidates_, c);
  if (next) {
    candidates_ = next, ++offset_;
    if (literal_whole()) end_value();
    return true;
  }
  bool one_whole = false;
  for (uint64_t rest = candidates_; rest; rest &= rest - 1)
    one_whole = one_whole || node(value_node_).texts[size_t(std::countr_zero(rest))].size() == offset_;
  if (!one_whole) return false;
  end_value();
  return push_byte(c);
}

// A free value (string, number, any value or object) read by JsonPrefix; an integer takes no
// fraction or exponent. A number ends at the byte after it, which its container then reads.
bool SchemaPrefix::scalar_byte(unsigned char c) {
  const bool integer = node(value_node_).kind == Kind::integer;
  if (!(integer && (c == '.' || c == 'e' || c == 'E')) && scalar_.push(char(c))) {
    if (scalar_.complete()) end_value();
    return true;
  }
  if (!scalar_.can_end() || scalar_.complete()) return false;
  end_value();
  return push_byte(c);
}

// Whether a value of node i can begin here: a value that must open an object or array cannot
// where kMaxDepth are open, so its key, or the array's next item, is refused before it (a key
// taken there would leave no byte to go on with).
bool SchemaPrefix::room_for(int32_t i) const {
  if (depth_ < kMaxDepth) return true;
  std::bitset<256> other = node(i).first;
  other['{'] = other['['] = false;
  return other.any();
}

bool SchemaPrefix::open(int32_t n, At at) {
  if (depth_ == kMaxDepth) return false;
  frames_[size_t(depth_++)] = Frame{n, 0, 0};
  mode_ = Mode::structure, at_ = at;
  return true;
}

bool SchemaPrefix::close() {
  --depth_;
  end_value();
  return true;
}

void SchemaPrefix::end_value() {
  if (depth_ == 0) {
    mode_ = Mode::done;
    return;
  }
  if (node(top().node).kind == Kind::array) ++top().items;
  mode_ = Mode::structure, at_ = At::comma_or_close;
}

bool SchemaPrefix::structure_byte(unsigned char c) {
  if (at_ != At::in_key && whitespace(c)) return whitespace_here();
  whitespace_run_ = 0;
  return node(top().node).kind == Kind::object ? object_byte(c) : array_byte(c);
}

bool SchemaPrefix::object_byte(unsigned char c) {
  const Node& n = node(top().node);
  const uint64_t all = n.keys.size() >= 64 ? ~uint64_t(0) : (uint64_t(1) << n.keys.size()) - 1;
  const uint64_t unseen = all & ~top().seen;
  const bool may_close = (top().seen & n.required) == n.required;
  switch (at_) {
    case At::key_or_close:
    case At::comma_or_close:
      if (c == '}') return may_close && close();
      if (at_ == At::key_or_close) {
        if (c != '"' || !unseen) return false;
        offset_ = 0, candidates_ = matching(n.keys, unseen, c), offset_ = 1, at_ = At::in_key;
        return true;
      }
      return c == ',' && unseen && (at_ = At::key, true);
    case At::key:
      if (c != '"') return false;
      offset_ = 0, candidates_ = matching(n.keys, unseen, c), offset_ = 1, at_ = At::in_key;
      return true;
    case At::in_key: {
      const uint64_t next = matching(n.keys, candidates_, c);
      if (!next) return false;
      const int k = std::countr_zero(next);
      if (n.keys[size_t(k)].size() == offset_ + 1) {  // (a key's closing quote ends it: no other goes on)
        if (!room_for(n.values[size_t(k)])) return false;
        top().seen |= uint64_t(1) << k;
        key_ = k, at_ = At::colon;
      }
      candidates_ = next, ++offset_;
      return true;
    }
    case At::colon:
      if (c != ':') return false;
      mode_ = Mode::value, value_node_ = n.values[size_t(key_)];
      return true;
    case At::item_or_close: return false;
  }
  return false;
}

bool SchemaPrefix::array_byte(unsigned char c) {
  const Node& n = node(top().node);
  const bool may_close = int64_t(top().items) >= n.min_items;
  const bool may_add = (n.max_items < 0 || int64_t(top().items) < n.max_items) && room_for(n.items);
  switch (at_) {
    case At::item_or_close:
      if (c == ']') return may_close && close();
      if (!may_add) return false;
      mode_ = Mode::value, value_node_ = n.items;
      return start_value(c);
    case At::comma_or_close:
      if (c == ']') return may_close && close();
      if (c != ',' || !may_add) return false;
      mode_ = Mode::value, value_node_ = n.items;
      return true;
    default: return false;
  }
}

}  // namespace lode::sample
