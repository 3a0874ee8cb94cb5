// A reply constrained to a JSON schema (`response_format` json_schema): the schema compiled into
// nodes, and SchemaPrefix, which reads a reply a byte at a time and refuses every byte after which
// no text could become a value the schema accepts. JsonPrefix (sample/json_prefix.h) reads the
// schema's free values (strings, numbers, anything under an empty schema).
//
// What a schema may say (anything else is refused when it is compiled, naming the keyword and
// where it is, rather than left unenforced):
// - type: object, array, string, number, integer, boolean, null, or a list of them;
// - properties and required (the reply holds only the listed properties, each at most once, every
//   required one, in any order; additionalProperties is read as false: a reply without extra
//   properties is valid either way); an object schema without properties: any object (or {} with
//   additionalProperties false; a schema there is refused);
// - items, minItems, maxItems; an object's or an array's keywords without a type: that kind;
// - enum and const (their values as compact JSON text, object keys sorted; with a type beside them,
//   those of that type);
// - anyOf and oneOf whose branches begin with different bytes (a string or null, an object or an
//   array, ...; a oneOf that a value could match two branches of is refused), allOf of one schema;
//   $ref to "#", "#/$defs/..." or "#/definitions/..." (recursion allowed); titles, descriptions and
//   other annotations are ignored.
// The root must be an object, as OpenAI's structured outputs require. Conservative where exactness
// would cost: keys and enum strings are matched as compact JSON writes them (no other escapes), an
// integer is written without fraction or exponent, and objects and arrays nest SchemaPrefix::kMaxDepth
// deep at most (a key whose value would open one more is refused).
#pragma once
#include <array>
#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sample/json_prefix.h"

namespace lode::sample {

class JsonSchema {
 public:
  struct Node {
    // any: any JSON value; any_object: any object; object: `keys` and their `values`.
    enum class Kind : uint8_t { any, any_object, object, array, string, number, integer, literals, choice };
    Kind kind = Kind::any;
    std::vector<std::string> keys;  // object: each property's name as JSON text, quotes included
    std::vector<int32_t> values;    // object: each property's node; choice: its branches
    uint64_t required = 0;          // object: bit i set where keys[i] must come
    int32_t items = -1;             // array: its items' node
    int64_t min_items = 0, max_items = -1;  // array (-1: no most)
    std::vector<std::string> texts;  // literals: the values it may be, as compact JSON text
    std::bitset<256> first;          // the bytes a value of it can begin with (made once compiled)
  };
  static constexpr size_t kMaxProperties = 64, kMaxLiterals = 64;

  // Fails (lode::Error) saying what in the schema is not supported, and where (a JSON pointer).
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::json& schema);
  // Any JSON object (`response_format` json_object): one schema for the process, which a reader
  // may tell by its address and read with JsonPrefix instead.
  static std::shared_ptr<const JsonSchema> any_object();

  const Node& node(int32_t i) const { return nodes_[size_t(i)]; }
  static constexpr int32_t kRoot = 0;

 private:
  friend class SchemaCompiler;
  std::vector<Node> nodes_;
};

// The beginning of a reply that the schema's root object can still become, read a byte at a time
// (as JsonPrefix, whose interface it shares: sample/json_tokens.h walks a vocabulary with either).
// A copy is a few hundred bytes and allocates nothing; the schema must outlive it.
class SchemaPrefix {
 public:
  explicit SchemaPrefix(const JsonSchema& schema);
  static constexpr int kMaxDepth = 16;  // objects and arrays open at once

  bool push(char c);  // false (and the state unchanged) where no valid reply goes on with c
  bool push(std::string_view bytes);  // every byte, or false at the first refused one
  bool complete() const { return mode_ == Mode::done; }
  // Inside a string of any text, where a byte other than '"', '\\' and the control bytes leaves
  // the state as it is.
  bool in_string() const;

 private:
  using Kind = JsonSchema::Node::Kind;
  enum class Mode : uint8_t { value, literal, scalar, structure, done };
  // Where a structure's top frame is: an object's key_or_close .. comma_or_close, an array's
  // item_or_close and comma_or_close.
  enum class At : uint8_t { key_or_close, key, in_key, colon, item_or_close, comma_or_close };
  struct Frame {
    int32_t node;
    uint32_t items;  // an array's items so far
    uint64_t seen;   // an object's properties so far (bits of Node::keys)
  };

  const JsonSchema::Node& node(int32_t i) const { return schema_->node(i); }
  const Frame& top() const { return frames_[size_t(depth_ - 1)]; }
  Frame& top() { return frames_[size_t(depth_ - 1)]; }
  bool push_byte(unsigned char c);
  bool whitespace_here();  // counts a whitespace byte of a run: false past its bound
  bool start_value(unsigned char c);
  bool literal_byte(unsigned char c);
  bool literal_whole() const;  // every literal still matching has been read whole
  bool scalar_byte(unsigned char c);
  bool structure_byte(unsigned char c);
  bool object_byte(unsigned char c);
  bool array_byte(unsigned char c);
  bool room_for(int32_t node) const;  // a value of this node can begin at this depth
  bool open(int32_t node, At at);
  bool close();
  void end_value();
  // Candidates (bits of texts) whose byte `offset_` is c; for keys, among those not yet seen.
  uint64_t matching(const std::vector<std::string>& texts, uint64_t among, unsigned char c) const;

  const JsonSchema* schema_;
  std::array<Frame, kMaxDepth> frames_{};
  int depth_ = 0;
  Mode mode_ = Mode::value;
  At at_ = At::key_or_close;
  uint8_t whitespace_run_ = 0;
  int32_t value_node_ = JsonSchema::kRoot;  // Mode::value, literal and scalar: the value's node
  uint64_t candidates_ = 0;  // Mode::literal and At::in_key: the texts still matching
  uint32_t offset_ = 0;      // and the bytes of them matched
  int key_ = -1;             // At::colon: the key read
  JsonPrefix scalar_;        // Mode::scalar: the free value so far
};

}  // namespace lode::sample
