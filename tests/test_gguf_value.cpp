// Metadata values: types, typed accessors and their errors, the one-line rendering, Metadata.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gguf/metadata.h"
#include "gguf/value.h"
#include "test_gguf_helpers.h"

using namespace lode;
using namespace lode::gguf;
using lode::test::fails_with;

TEST(GgufValue, ConstructorsPickTheExactType) {
  EXPECT_EQ(Value(uint8_t(1)).type(), ValueType::U8);
  EXPECT_EQ(Value(int8_t(1)).type(), ValueType::I8);
  EXPECT_EQ(Value(uint16_t(1)).type(), ValueType::U16);
  EXPECT_EQ(Value(int16_t(1)).type(), ValueType::I16);
  EXPECT_EQ(Value(1u).type(), ValueType::U32);
  EXPECT_EQ(Value(1).type(), ValueType::I32);
  EXPECT_EQ(Value(1.0f).type(), ValueType::F32);
  EXPECT_EQ(Value(true).type(), ValueType::Bool);
  EXPECT_EQ(Value("text").type(), ValueType::String);
  EXPECT_EQ(Value(std::string("text")).type(), ValueType::String);
  EXPECT_EQ(Value(Array(std::vector<int32_t>{1})).type(), ValueType::Array);
  EXPECT_EQ(Value(uint64_t(1)).type(), ValueType::U64);
  EXPECT_EQ(Value(int64_t(1)).type(), ValueType::I64);
  EXPECT_EQ(Value(1.0).type(), ValueType::F64);
}

TEST(GgufValue, TypeNamesAndIds) {
  const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
                         "array", "u64", "i64", "f64"};
  for (uint32_t id = 0; id < kValueTypeCount; ++id) {
    ASSERT_TRUE(value_type_from_id(id).has_value());
    EXPECT_STREQ(value_type_name(*value_type_from_id(id)), names[id]);
  }
  EXPECT_FALSE(value_type_from_id(13).has_value());
  EXPECT_FALSE(value_type_from_id(0xffffffff).has_value());
  EXPECT_EQ(value_type_size(ValueType::F64), 8u);
  EXPECT_EQ(value_type_size(ValueType::Bool), 1u);
  EXPECT_EQ(value_type_size(ValueType::String), 0u);
}

TEST(GgufValue, AccessorsReturnTheValue) {
  EXPECT_EQ(Value(uint8_t(200)).as_u8(), 200);
  EXPECT_EQ(Value(int8_t(-100)).as_i8(), -100);
  EXPECT_EQ(Value(uint16_t(60000)).as_u16(), 60000);
  EXPECT_EQ(Value(int16_t(-30000)).as_i16(), -30000);
  EXPECT_EQ(Value(4000000000u).as_u32(), 4000000000u);
  EXPECT_EQ(Value(-2000000000).as_i32(), -2000000000);
  EXPECT_EQ(Value(1.5f).as_f32(), 1.5f);
  EXPECT_EQ(Value(false).as_bool(), false);
  EXPECT_EQ(Value("abc").as_string(), "abc");
  EXPECT_EQ(Value(uint64_t(1) << 63).as_u64(), uint64_t(1) << 63);
  EXPECT_EQ(Value(int64_t(-1) << 62).as_i64(), int64_t(-1) << 62);
  EXPECT_EQ(Value(0.1).as_f64(), 0.1);
  EXPECT_EQ(Value(Array(std::vector<int32_t>{1, 2})).as_array().values<int32_t>()[1], 2);
}

TEST(GgufValue, WrongTypeFailsNamingBothTypes) {
  EXPECT_TRUE(fails_with([] { Value("abc").as_u32(); }, {"expected u32", "found string \"abc\""}));
  EXPECT_TRUE(fails_with([] { Value(7).as_u32(); }, {"expected u32", "found i32 7"}));
  EXPECT_TRUE(fails_with([] { Value(7u).as_string(); }, {"expected string", "found u32 7"}));
  EXPECT_TRUE(fails_with([] { Value(1.0f).as_array(); }, {"expected array", "found f32 1.0"}));
  EXPECT_TRUE(fails_with([] { Value(true).as_f64(); }, {"expected f64", "found bool true"}));
  const Array ints(std::vector<int32_t>{1, 2});
  EXPECT_TRUE(fails_with([&] { ints.values<float>(); }, {"array of f32", "array of i32"}));
  EXPECT_TRUE(fails_with([&] { ints.strings(); }, {"array of string", "array of i32"}));
  EXPECT_TRUE(fails_with([&] { ints.arrays(); }, {"array of array"}));
  EXPECT_TRUE(fails_with([&] { ints.at(2); }, {"index 2", "2 items"}));
}

TEST(GgufValue, LenientIntegerAccessors) {
  EXPECT_EQ(Value(uint8_t(5)).to_int64(), 5);
  EXPECT_EQ(Value(int16_t(-5)).to_int64(), -5);
  EXPECT_EQ(Value(4000000000u).to_int64(), 4000000000);
  EXPECT_EQ(Value(uint64_t(7)).to_uint64(), 7u);
  EXPECT_EQ(Value(int32_t(7)).to_uint64(), 7u);
  EXPECT_EQ(Value(uint64_t(-1)).to_uint64(), uint64_t(-1));
  EXPECT_TRUE(fails_with([] { Value(uint64_t(-1)).to_int64(); }, {"does not fit"}));
  EXPECT_TRUE(fails_with([] { Value(-1).to_uint64(); }, {"non-negative", "-1"}));
  EXPECT_TRUE(fails_with([] { Value(1.0f).to_int64(); }, {"expected an integer", "f32"}));
  EXPECT_TRUE(fails_with([] { Value(true).to_int64(); }, {"expected an integer", "bool"}));
  EXPECT_DOUBLE_EQ(Value(3).to_double(), 3.0);
  EXPECT_DOUBLE_EQ(Value(0.25f).to_double(), 0.25);
  EXPECT_TRUE(fails_with([] { Value("x").to_double(); }, {"expected a number"}));
  EXPECT_EQ(Array(std::vector<uint16_t>{1, 2}).to_integers(), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(fails_with([] { Array(std::vector<float>{1}).to_integers(); }, {"integers", "f32"}));
}

TEST(GgufValue, ArraysOfEveryTypeIncludingNested) {
  EXPECT_EQ(Array(std::vector<bool>{true, false}).element_type(), ValueType::Bool);
  EXPECT_EQ(Array(std::vector<double>{1}).element_type(), ValueType::F64);
  EXPECT_EQ(Array(std::vector<std::string>{"a"}).element_type(), ValueType::String);
  const Array nested(std::vector<Array>{Array(std::vector<int8_t>{1, 2}),
                                        Array(std::vector<std::string>{"x"}),
                                        Array(std::vector<Array>{Array::empty(ValueType::F32)})});
  EXPECT_EQ(nested.element_type(), ValueType::Array);
  EXPECT_EQ(nested.size(), 3u);
  EXPECT_EQ(nested.arrays()[1].strings()[0], "x");
  EXPECT_EQ(nested.at(0).as_array().values<int8_t>()[1], 2);
  EXPECT_EQ(nested.arrays()[2].arrays()[0].element_type(), ValueType::F32);
  for (uint32_t id = 0; id < kValueTypeCount; ++id) {
    const Array empty = Array::empty(ValueType(id));
    EXPECT_EQ(empty.element_type(), ValueType(id));
    EXPECT_TRUE(empty.empty());
  }
  EXPECT_EQ(Array(std::vector<bool>{true, false}).at(0), Value(true));
}

TEST(GgufRender, ScalarsAndStrings) {
  EXPECT_EQ(render(Value(uint8_t(255))), "255");
  EXPECT_EQ(render(Value(int8_t(-128))), "-128");
  EXPECT_EQ(render(Value(-7)), "-7");
  EXPECT_EQ(render(Value(1.0f)), "1.0");
  EXPECT_EQ(render(Value(1e-6f)), "1e-06");
  EXPECT_EQ(render(Value(0.1)), "0.1");
  EXPECT_EQ(render(Value(std::numeric_limits<double>::infinity())), "inf");
  EXPECT_EQ(render(Value(true)), "true");
  EXPECT_EQ(render(Value("qwen35moe")), "\"qwen35moe\"");
  EXPECT_EQ(render(Value("say \"hi\"\\\n\t")), R"("say \"hi\"\\\n\t")");
  EXPECT_EQ(render(Value(std::string("a\0b", 3))), R"("a\x00b")");
  EXPECT_EQ(render(Value("Ġthe ✓")), "\"Ġthe ✓\"");  // valid UTF-8 shown as is
  EXPECT_EQ(render(Value("\xff\xc3")), R"("\xff\xc3")");  // invalid bytes escaped
  EXPECT_EQ(render(Value("\xed\xa0\x80")), R"("\xed\xa0\x80")");  // a surrogate is not UTF-8
  EXPECT_EQ(render(Value("abcdefgh"), {.max_items = 8, .max_string_bytes = 3}),
            "\"abc\"... (8 bytes)");
  EXPECT_EQ(render(Value("ééé"), {.max_items = 8, .max_string_bytes = 3}),
            "\"é\"... (6 bytes)");  // cut at a character boundary
}

TEST(GgufRender, LongArraysAreAbbreviated) {
  std::vector<int32_t> tokens(248320);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i + 1);
  EXPECT_EQ(render(Value(Array(tokens)), {.max_items = 3}), "[1, 2, 3, ... 248320 items]");
  EXPECT_EQ(render(Array(std::vector<int32_t>{1, 2, 3}), {.max_items = 3}), "[1, 2, 3]");
  EXPECT_EQ(render(Array(std::vector<std::string>{"a\"", "b"})), R"(["a\"", "b"])");
  EXPECT_EQ(render(Array(std::vector<bool>{true, false})), "[true, false]");
  EXPECT_EQ(render(Array(std::vector<float>{0.5f, 2.0f})), "[0.5, 2.0]");
  EXPECT_EQ(render(Array::empty(ValueType::U64)), "[]");
  const Array nested(std::vector<Array>{Array(std::vector<uint8_t>{1, 2}),
                                        Array(std::vector<std::string>{"x"})});
  EXPECT_EQ(render(nested), R"([[1, 2], ["x"]])");
  EXPECT_EQ(render(nested, {.max_items = 1}), "[[1, ... 2 items], ... 2 items]");
}

TEST(GgufMetadata, KeepsFileOrderAndLooksUpByKey) {
  Metadata m("model.gguf");
  m.set("b", Value(1u));
  m.set("a", Value("x"));
  m.set("b", Value(2u));  // replaced in place
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.entries()[0].key, "b");
  EXPECT_EQ(m.entries()[1].key, "a");
  EXPECT_EQ(m.get<uint32_t>("b"), 2u);
  EXPECT_EQ(m.get_string("a"), "x");
  EXPECT_EQ(m.get_int64("b"), 2);
  EXPECT_EQ(m.get_or<uint32_t>("missing", 9u), 9u);
  EXPECT_EQ(m.get_string_or("missing", "d"), "d");
  EXPECT_EQ(m.find("missing"), nullptr);
  EXPECT_TRUE(fails_with([&] { m.at("missing"); }, {"model.gguf", "'missing'", "missing"}));
  EXPECT_TRUE(fails_with([&] { m.get<float>("b"); },
                         {"model.gguf", "key 'b'", "expected f32", "found u32 2"}));
  EXPECT_TRUE(fails_with([&] { m.get_or<float>("b", 1.0f); }, {"expected f32"}));
  EXPECT_TRUE(fails_with([&] { m.add_new("a", Value(1)); }, {"'a' appears twice"}));
  EXPECT_TRUE(m.erase("b"));
  EXPECT_FALSE(m.erase("b"));
  EXPECT_EQ(m.entries()[0].key, "a");
  EXPECT_EQ(m.get_string("a"), "x");
}
