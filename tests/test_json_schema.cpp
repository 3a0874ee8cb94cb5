// Replies constrained to a JSON schema (sample/json_schema.h): what compiles and what is refused,
// saying where; the byte automaton takes every valid reply (random documents of each schema, written
// with random whitespace and key orders) and refuses the bytes that would break one; the vocabulary
// mask agrees with trying every token; the chat route's reply is an object of the schema.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "sample/json_schema.h"
#include "sample/json_tokens.h"
#include "test_server_support.h"

namespace lode::test {
namespace {

using json = nlohmann::json;
using sample::JsonSchema;
using sample::SchemaPrefix;

const json kWeather = json::parse(R"({
  "type": "object",
  "properties": {
    "city": {"type": "string", "description": "where"},
    "temp": {"type": "number"},
    "unit": {"enum": ["c", "f"]},
    "days": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    "ok": {"type": "boolean"},
    "note": {"type": ["string", "null"]},
    "level": {"enum": [1, 12, "high"]}
  },
  "required": ["city", "temp", "unit"],
  "additionalProperties": false
})");

// Pydantic's shape: models under $defs, Optional as anyOf with null, a recursive list.
const json kTree = json::parse(R"({
  "$defs": {
    "Node": {
      "type": "object",
      "properties": {
        "name": {"type": "string"},
        "size": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}
      },
      "required": ["name"]
    }
  },
  "title": "Tree",
  "type": "object",
  "properties": {"root": {"$ref": "#/$defs/Node"}, "meta": {}},
  "required": ["root"]
})");

bool takes(const JsonSchema& schema, std::string_view text, bool whole = true) {
  SchemaPrefix p(schema);
  return p.push(text) && p.complete() == whole;
}

TEST(JsonSchema, TakesValidRepliesInAnyKeyOrderWithWhitespace) {
  const auto weather = JsonSchema::compile(kWeather);
  for (const char* ok : {R"({"city":"Oslo","temp":-3.5e1,"unit":"c"})",
                         R"({ "unit" : "f", "temp": 12, "city": "" })",
                         "{\n  \"city\": \"a\\\"b\\u00e9\",\n  \"temp\": 0.25,\n  \"unit\": \"c\",\n  \"days\": [1, 2, 3]\n}",
                         R"({"city":"x","temp":1,"unit":"c","ok":false,"note":null,"level":12})",
                         R"({"city":"x","temp":1,"unit":"c","note":"n","level":"high","days":[-7]})",
                         R"({"city":"x","temp":1,"unit":"c","level":1})"})
    EXPECT_TRUE(takes(*weather, ok)) << ok;
  const auto tree = JsonSchema::compile(kTree);
  EXPECT_TRUE(takes(*tree, R"({"root":{"name":"a","children":[{"name":"b","size":3,"children":[]},{"name":"c","size":null}]}})"));
  EXPECT_TRUE(takes(*tree, R"({"meta":[1,{"x":[true]}],"root":{"name":"a"}})"));
  EXPECT_TRUE(takes(*JsonSchema::any_object(), R"({"a":[1,{"b":null}],"c":"d"})"));
}

TEST(JsonSchema, RefusesTheByteThatBreaksTheSchema) {
  const auto weather = JsonSchema::compile(kWeather);
  const auto refused_at = [&](std::string_view text) {  // the offset of the first refused byte, or -1
    SchemaPrefix p(*weather);
    for (size_t i = 0; i < text.size(); ++i)
      if (!p.push(text[i])) return int(i);
    return -1;
  };
  const std::string base = R"({"city":"x","temp":1,"unit":"c")";
  EXPECT_EQ(refused_at(R"({"city":"x"})"), 11);         // '}' before temp and unit, which are required
  EXPECT_EQ(refused_at(R"({"town":)"), 3);              // no property begins "t" then "o"
  EXPECT_EQ(refused_at(R"({"city":"x","city")"), 13);   // a property once
  EXPECT_EQ(refused_at(R"({"city":1)"), 8);             // a string, not a number
  EXPECT_EQ(refused_at(base + R"(,"days":[1.5)"), int(base.size()) + 10);  // integers: no fraction
  EXPECT_EQ(refused_at(base + R"(,"days":[])"), int(base.size()) + 9);     // at least one
  EXPECT_EQ(refused_at(base + R"(,"days":[1,2,3,)"), int(base.size()) + 14);  // at most three
  EXPECT_EQ(refused_at(base + R"(,"unit")"), int(base.size()) + 2);        // seen: "u" begins no other
  EXPECT_EQ(refused_at(base + R"(,"level":2)"), int(base.size()) + 9);     // 1, 12 or "high"
  EXPECT_EQ(refused_at(base + R"(,"level":1)"), -1);
  EXPECT_EQ(refused_at(base + R"(,"level":12})"), -1);
  EXPECT_EQ(refused_at(base + R"(,"level":123)"), int(base.size()) + 11);
  EXPECT_EQ(refused_at(base + R"(,"ok":nul)"), int(base.size()) + 6);     // a boolean
  EXPECT_EQ(refused_at(base + R"(} )"), int(base.size()) + 1);             // nothing after the object
  EXPECT_EQ(refused_at("[1]"), 0);                                       // the root is an object
  EXPECT_EQ(refused_at(R"({"city":"x" ,)" + std::string(30, ' ')), 13 + int(sample::JsonPrefix::kMaxWhitespaceRun));
  SchemaPrefix p(*weather);
  ASSERT_TRUE(p.push(std::string_view(R"({"city":"ab)")));
  EXPECT_TRUE(p.in_string());  // a free string: the mask takes string-safe tokens untried
  ASSERT_TRUE(p.push(std::string_view(R"(","unit":")")));
  EXPECT_FALSE(p.in_string());  // an enum's string: only its values
}

// A random document of node i, as text with random whitespace and key orders.
std::string random_value(const JsonSchema& s, int32_t i, std::mt19937& rng, int depth);

std::string space(std::mt19937& rng) {
  static const char* kinds[] = {"", "", "", " ", "\n  ", "\t"};
  return kinds[rng() % 6];
}

std::string random_value(const JsonSchema& s, int32_t i, std::mt19937& rng, int depth) {
  using Kind = JsonSchema::Node::Kind;
  const JsonSchema::Node& n = s.node(i);
  switch (n.kind) {
    case Kind::any:
    case Kind::any_object: {
      const json samples[] = {json::object(), json{{"k", {1, "v", nullptr}}}, json{{"x", json::object()}}};
      const json& v = samples[rng() % 3];
      return n.kind == Kind::any && rng() % 2 ? json(int(rng() % 100) - 50).dump() : v.dump();
    }
    case Kind::string: {
      const char* strings[] = {"\"\"", "\"plain\"", "\"q\\\"uote\\n\"", "\"\\u00e9t\\u00E9\"", "\"caf\xc3\xa9\""};
      return strings[rng() % 5];
    }
    case Kind::number: {
      const char* numbers[] = {"0", "-1", "3.25", "1e3", "-0.5E-2", "42"};
      return numbers[rng() % 6];
    }
    case Kind::integer: return std::to_string(int(rng() % 2000) - 1000);
    case Kind::literals: return n.texts[rng() % n.texts.size()];
    case Kind::choice: return random_value(s, n.values[rng() % n.values.size()], rng, depth);
    case Kind::array: {
      int64_t most = n.max_items >= 0 ? n.max_items : 3;
      if (depth > 3) most = n.min_items;
      const int64_t count = n.min_items + int64_t(rng() % uint32_t(most - n.min_items + 1));
      std::string out = "[" + space(rng);
      for (int64_t k = 0; k < count; ++k)
        out += (k ? "," + space(rng) : "") + random_value(s, n.items, rng, depth + 1) + space(rng);
      return out + "]";
    }
    case Kind::object: {
      std::vector<size_t> keys;
      for (size_t k = 0; k < n.keys.size(); ++k)
        if ((n.required >> k & 1) || (depth < 3 && rng() % 2)) keys.push_back(k);
      std::shuffle(keys.begin(), keys.end(), rng);
      std::string out = "{" + space(rng);
      for (size_t k = 0; k < keys.size(); ++k)
        out += (k ? "," + space(rng) : "") + n.keys[keys[k]] + space(rng) + ":" + space(rng) +
               random_value(s, n.values[keys[k]], rng, depth + 1) + space(rng);
      return out + "}";
    }
  }
  return "";
}

TEST(JsonSchema, TakesRandomDocumentsOfItsSchemas) {
  std::mt19937 rng(5);
  for (const json& schema : {kWeather, kTree}) {
    const auto compiled = JsonSchema::compile(schema);
    for (int round = 0; round < 300; ++round) {
      const std::string text = random_value(*compiled, JsonSchema::kRoot, rng, 0);
      EXPECT_TRUE(takes(*compiled, text)) << text;
      EXPECT_TRUE(json::accept(text)) << text;
    }
  }
}

TEST(JsonSchema, RefusesWhatItCannotEnforceSayingWhere) {
  const auto refused = [](const json& schema, const std::string& says) {
    try {
      (void)JsonSchema::compile(schema);
      ADD_FAILURE() << "compiled: " << schema.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused(json::parse(R"({"type":"object","properties":{"zip":{"type":"string","pattern":"^[0-9]+$"}}})"),
          "'pattern' is not enforced (at \"#/properties/zip/pattern\")");
  refused(json::parse(R"({"type":"array"})"), "the root must be an object");
  refused(json::parse(R"({"type":"object","properties":{"a":{"anyOf":[{"type":"object"},{"type":"object","properties":{"b":{}}}]}}})"),
          "whose branches can begin alike");
  refused(json::parse(R"({"type":"object","properties":{"a":{"$ref":"other.json#/x"}}})"), "is not within this schema");
  refused(json::parse(R"({"type":"object","properties":{"a":{"$ref":"#/$defs/missing"}}})"), "points at nothing");
  refused(json::parse(R"({"type":"object","required":["a"],"properties":{"b":{}}})"), "required \"a\" is not among");
  refused(json::parse(R"({"type":"object","properties":{"a":{"type":"date"}}})"), "unknown type \"date\"");
  json many = json::array();
  for (int i = 0; i < 65; ++i) many.push_back(i);
  refused(json{{"type", "object"}, {"properties", {{"a", {{"enum", many}}}}}}, "more than 64 values");
  refused(json::parse(R"({"$defs":{"A":{"$ref":"#/$defs/B"},"B":{"$ref":"#/$defs/A"}},"type":"object","properties":{"a":{"$ref":"#/$defs/A"}}})"),
          "refers to itself");
  refused(json::parse(R"({"type":"object","properties":{"a/b":{"type":"string","minLength":1}}})"),
          "'minLength' is not enforced (at \"#/properties/a~1b/minLength\")");
  refused(json::parse(R"({"type":"object","properties":{"d":{"type":"object","additionalProperties":{"type":"integer"}}}})"),
          "additionalProperties as a schema is not enforced");
  refused(json::parse(R"({"type":"object","properties":{"e":{"enum":["a","b"],"allOf":[{"const":"a"}]}}})"),
          "enum or const with keywords beside it");
  for (const char* overlapping : {R"([{"type":"integer"},{"type":"number"}])", R"([{"enum":["x","y"]},{"const":"x"}])",
                                  R"([{"type":"boolean"},{"const":true}])", R"([{},{"type":"string"}])"})
    refused(json{{"type", "object"}, {"properties", {{"o", {{"oneOf", json::parse(overlapping)}}}}}},
            "oneOf whose branches a value can match two of");
  refused(json::parse(R"({"$ref":"#/$defs/N","$defs":{"N":{"type":"object","properties":{"p":{"anyOf":[{"$ref":"#"},{"type":"null"}]}}}}})"),
          "a $ref back to a schema that is no object or array yet");
  refused(json::parse(R"({"$defs":{"A":{"anyOf":[{"$ref":"#/$defs/B"},{"type":"null"}]},"B":{"anyOf":[{"$ref":"#/$defs/A"},{"type":"string"}]}},
                          "type":"object","properties":{"a":{"$ref":"#/$defs/A"}}})"),
          "a $ref back to a schema that is no object or array yet");
  json a = json::array(), b = json::array();
  for (int i = 0; i < 64; ++i) a.push_back("a" + std::to_string(i)), b.push_back("b" + std::to_string(i));
  refused(json{{"type", "object"}, {"properties", {{"v", {{"anyOf", {{{"enum", a}}, {{"enum", b}}}}}}}}},
          "more than 64 values in its branches' enums together");
  json deep = {{"type", "string"}};
  for (int i = 0; i < 100; ++i) deep = {{"type", "array"}, {"items", deep}};
  refused(json{{"type", "object"}, {"properties", {{"deep", deep}}}}, "nested more than 64 deep");
  // Read: a boolean schema, an object without properties (any object), an empty enum-free schema.
  EXPECT_NO_THROW((void)JsonSchema::compile(json::parse(R"({"type":"object","properties":{"a":true,"b":{"type":"object"}}})")));
}

// Keywords that constrain only one kind, with no type: that kind (a valid reply either way); enum
// values outside a type beside them left out; a one-branch allOf that refers back to an object.
TEST(JsonSchema, ReadsKindKeywordsEnumTypesAndAllOfOfARefBack) {
  const auto s = JsonSchema::compile(json::parse(R"({"type":"object","properties":{
      "list":{"minItems":2,"maxItems":2}, "closed":{"additionalProperties":false},
      "word":{"type":"string","enum":["x",1]}, "child":{"allOf":[{"$ref":"#"}],"description":"d"}}})"));
  EXPECT_TRUE(takes(*s, R"({"list":[1,"a"],"closed":{},"word":"x","child":{"child":{"list":[[],{}]}}})"));
  EXPECT_FALSE(takes(*s, R"({"list":[])", false));
  EXPECT_FALSE(takes(*s, R"({"list":[1,2,3)", false));
  EXPECT_FALSE(takes(*s, R"({"closed":{"b)", false));
  EXPECT_FALSE(takes(*s, R"({"word":1)", false));
}

// At SchemaPrefix::kMaxDepth open objects and arrays, a key whose value must open another is
// refused at its closing quote (it would leave no byte to go on with); the object can still close.
TEST(JsonSchema, RefusesAKeyWhoseValueCannotOpenAtItsDepth) {
  const auto tree = JsonSchema::compile(kTree);
  std::string text = R"({"root":)";
  int open = 1;
  while (open + 2 <= SchemaPrefix::kMaxDepth) text += R"({"name":"a","children":[)", open += 2;
  text += R"({"name":"a")";  // the kMaxDepth-th open
  ++open;
  ASSERT_EQ(open, SchemaPrefix::kMaxDepth);
  SchemaPrefix p(*tree);
  ASSERT_TRUE(p.push(std::string_view(text)));
  SchemaPrefix key = p;
  EXPECT_TRUE(key.push(std::string_view(R"(,"children)")));
  EXPECT_FALSE(key.push('"'));  // its array cannot open here
  SchemaPrefix sized = p;
  EXPECT_TRUE(sized.push(std::string_view(R"(,"size":3})")));  // another key, then the close
  std::string closing;
  for (int i = open - 1; i > 0; --i) closing += i % 2 && i > 1 ? "]" : "}";  // (each node's array, then it; the root)
  EXPECT_TRUE(sized.push(std::string_view(closing)) && sized.complete()) << closing;
}

// The mask over lode-mini's vocabulary takes exactly the tokens whose bytes the state takes, in
// keys, enums, free strings, numbers and between values.
TEST(JsonSchema, TheMaskTakesWhatTryingEveryTokenTakes) {
  const auto [views, excluded] = mini_token_bytes();
  const sample::JsonTokens tokens(views, excluded);
  const auto weather = JsonSchema::compile(kWeather);
  std::vector<uint8_t> allowed;
  for (const char* prefix : {"", "{", "{\"c", "{\"city\"", "{\"city\":", "{\"city\":\"O", "{\"city\":\"x\",\"temp\":1",
                             "{\"city\":\"x\",\"unit\":\"", "{\"city\":\"x\",\"days\":[", "{\"city\":\"x\",\"level\":1",
                             "{\"city\":\"x\",\"temp\":1,\"unit\":\"c\""}) {
    SchemaPrefix state(*weather);
    ASSERT_TRUE(state.push(std::string_view(prefix))) << prefix;
    tokens.mark(state, allowed);
    ASSERT_EQ(allowed.size(), views.size());
    size_t taken = 0;
    for (size_t id = 0; id < views.size(); ++id) {
      SchemaPrefix tried = state;
      const bool ok = !excluded[id] && !views[id].empty() && tried.push(views[id]);
      EXPECT_EQ(bool(allowed[id]), ok) << "after " << prefix << ", token " << id << " \"" << views[id] << "\"";
      taken += ok;
    }
    EXPECT_GT(taken, 0u) << prefix;
  }
}

// The chat route: a reply of the schema (lode-mini, kept from whitespace tokens, which the schema
// allows in runs but which would use up its tokens), whole and valid; the completions route too.
TEST(JsonSchema, TheChatRouteGivesAnObjectOfTheSchema) {
  TestServer s;
  const tokenizer::Tokenizer& tok = mini_model()->tokenizer;
  json bias = json::object();
  for (int32_t id = 0; id < int32_t(tok.size()); ++id) {
    const std::string_view b = tok.token_bytes(id);
    if (!b.empty() && b.find_first_not_of(" \t\n\r") == std::string_view::npos) bias[std::to_string(id)] = -100;
  }
  const json schema = json::parse(R"({"type":"object","properties":{"ok":{"type":"boolean"},
      "size":{"enum":["small","large"]},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},
      "required":["ok","size"],"additionalProperties":false})");
  const json format = {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"schema", schema}, {"strict", true}}}};
  const auto check = [&](const std::string& text) {
    const json reply = json::parse(text);
    ASSERT_TRUE(reply.is_object()) << text;
    ASSERT_TRUE(reply.contains("ok") && reply["ok"].is_boolean()) << text;
    ASSERT_TRUE(reply.contains("size")) << text;
    EXPECT_TRUE(reply["size"] == "small" || reply["size"] == "large") << text;
    for (const auto& [key, value] : reply.items()) EXPECT_TRUE(key == "ok" || key == "size" || key == "tags") << text;
    if (reply.contains("tags")) EXPECT_LE(reply["tags"].size(), 2u) << text;
  };
  const json body = {{"messages", {{{"role", "user"}, {"content", "Is /etc small?"}}}}, {"max_tokens", 80},
                     {"temperature", 0}, {"reasoning_effort", "none"}, {"logit_bias", bias}, {"response_format", format}};
  const json chat = s.post_json("/v1/chat/completions", body);
  ASSERT_EQ(chat["choices"][0]["finish_reason"], "stop") << chat;
  check(chat["choices"][0]["message"]["content"].get<std::string>());
  json sampled = body;
  sampled["temperature"] = 1.0, sampled["seed"] = 7;
  const json other = s.post_json("/v1/chat/completions", sampled);
  ASSERT_EQ(other["choices"][0]["finish_reason"], "stop") << other;
  check(other["choices"][0]["message"]["content"].get<std::string>());
  const json completion = s.post_json("/v1/completions", {{"prompt", "Answer:"}, {"max_tokens", 80}, {"temperature", 0},
                                                          {"logit_bias", bias}, {"response_format", format}});
  ASSERT_EQ(completion["choices"][0]["finish_reason"], "stop") << completion;
  check(completion["choices"][0]["text"].get<std::string>());
}

}  // namespace
}  // namespace lode::test
