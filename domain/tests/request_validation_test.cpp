// Request validation (DESIGN.md, "Messages"): an invalid corpus with the
// exact error of each case, the valid shapes that must pass, the payload
// hash, and the error codes that go into dead-letter headers.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "sagapool/request.hpp"

namespace sagapool {
namespace {

using E = RequestError;

// A request whose four required values are given as raw JSON text.
std::string request(std::string_view id, std::string_view from, std::string_view to,
                    std::string_view amount, std::string_view extra = "") {
  std::string s = "{\"id\":";
  s.append(id).append(",\"from\":").append(from).append(",\"to\":").append(to);
  s.append(",\"amount\":").append(amount);
  if (!extra.empty()) s.append(",").append(extra);
  s.append("}");
  return s;
}

constexpr std::string_view kId = R"("t-1")";
constexpr std::string_view kFrom = R"("acct-1")";
constexpr std::string_view kTo = R"("acct-2")";
constexpr std::string_view kAmount = "2500";

std::string valid() { return request(kId, kFrom, kTo, kAmount); }
std::string with_id(std::string_view v) { return request(v, kFrom, kTo, kAmount); }
std::string with_from(std::string_view v) { return request(kId, v, kTo, kAmount); }
std::string with_to(std::string_view v) { return request(kId, kFrom, v, kAmount); }
std::string with_amount(std::string_view v) { return request(kId, kFrom, kTo, v); }
std::string with_extra(std::string_view extra) { return request(kId, kFrom, kTo, kAmount, extra); }
std::string with_currency(std::string_view v) {
  return with_extra("\"currency\":" + std::string(v));
}
std::string with_metadata(std::string_view v) {
  return with_extra("\"metadata\":" + std::string(v));
}

std::string json_string(std::string_view body) { return "\"" + std::string(body) + "\""; }

// `depth` nested objects: {"a":{"a":{}}} has depth 3.
std::string nested_objects(int depth) {
  std::string s;
  for (int i = 1; i < depth; ++i) s += "{\"a\":";
  s += "{}";
  for (int i = 1; i < depth; ++i) s += "}";
  return s;
}

// An object holding `arrays` nested arrays: depth arrays + 1.
std::string object_of_arrays(int arrays) {
  return "{\"a\":" + std::string(static_cast<std::size_t>(arrays), '[') +
         std::string(static_cast<std::size_t>(arrays), ']') + "}";
}

// A metadata object of exactly `size` bytes (size >= 8).
std::string metadata_of_size(std::size_t size) {
  return "{\"k\":\"" + std::string(size - 8, 'x') + "\"}";
}

// A valid request padded with trailing whitespace to exactly `size` bytes.
std::string padded_to(std::string s, std::size_t size) {
  s.append(size - s.size(), ' ');
  return s;
}

struct Case {
  std::string name;
  std::string input;
  RequestError want;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name << " (" << c.input.size() << " bytes, want " << error_code(c.want) << ")";
}

std::vector<Case> invalid_corpus() {
  const std::string big_digits(1000, '9');
  return {
      // Size and encoding, checked on the whole message before any JSON.
      {"empty", "", E::empty},
      {"too_large_64KiB_plus_1", padded_to(valid(), kMaxRequestBytes + 1), E::too_large},
      {"too_large_beats_not_utf8", std::string(kMaxRequestBytes + 1, '\xFF'), E::too_large},
      {"utf8_overlong_2byte", with_id("\"\xC0\xAF\""), E::not_utf8},
      {"utf8_overlong_2byte_c1", with_id("\"\xC1\xBF\""), E::not_utf8},
      {"utf8_overlong_3byte", with_id("\"\xE0\x80\xAF\""), E::not_utf8},
      {"utf8_overlong_4byte", with_id("\"\xF0\x80\x80\xAF\""), E::not_utf8},
      {"utf8_surrogate_high", with_metadata("{\"a\":\"\xED\xA0\x80\"}"), E::not_utf8},
      {"utf8_surrogate_low", with_metadata("{\"a\":\"\xED\xBF\xBF\"}"), E::not_utf8},
      {"utf8_above_10FFFF", with_metadata("{\"a\":\"\xF4\x90\x80\x80\"}"), E::not_utf8},
      {"utf8_lead_f5", with_metadata("{\"a\":\"\xF5\x80\x80\x80\"}"), E::not_utf8},
      {"utf8_truncated_in_string", with_metadata("{\"a\":\"\xE2\x82\"}"), E::not_utf8},
      {"utf8_truncated_4byte", with_metadata("{\"a\":\"\xF0\x9F\x98\"}"), E::not_utf8},
      {"utf8_truncated_at_end", valid() + "\xE2\x82", E::not_utf8},
      {"utf8_byte_ff", with_metadata("{\"a\":\"\xFF\"}"), E::not_utf8},
      {"utf8_lone_continuation", with_metadata("{\"a\":\"\x80\"}"), E::not_utf8},
      {"utf8_beats_malformed_json", "{\"id\": \xFF", E::not_utf8},

      // JSON structure.
      {"not_json", "hello", E::malformed_json},
      {"whitespace_only", " \t\r\n", E::malformed_json},
      {"truncated_object", R"({"id":"t-1")", E::malformed_json},
      {"unterminated_string", R"({"id":"t-1)", E::malformed_json},
      {"trailing_comma", R"({"id":"t-1",})", E::malformed_json},
      {"single_quotes", "{'id':'t-1'}", E::malformed_json},
      {"unquoted_key", R"({id:"t-1"})", E::malformed_json},
      {"missing_colon", R"({"id" "t-1"})", E::malformed_json},
      {"missing_comma", R"({"id":"t-1" "from":"a"})", E::malformed_json},
      {"form_feed_is_not_whitespace", "{\f" + valid().substr(1), E::malformed_json},
      {"nbsp_is_not_whitespace", "{\xC2\xA0" + valid().substr(1), E::malformed_json},
      {"utf8_bom_prefix", "\xEF\xBB\xBF" + valid(), E::malformed_json},
      {"top_level_array", "[1,2]", E::not_object},
      {"top_level_string", R"("abc")", E::not_object},
      {"top_level_number", "42", E::not_object},
      {"top_level_null", "null", E::not_object},
      {"top_level_array_truncated", "[1,", E::malformed_json},
      {"trailing_garbage", valid() + "x", E::trailing_data},
      {"two_objects", valid() + valid(), E::trailing_data},
      {"two_objects_newline", valid() + "\n" + valid(), E::trailing_data},
      {"trailing_nul", valid() + std::string(1, '\0'), E::trailing_data},
      {"control_char_tab_in_id", with_id("\"t\t1\""), E::malformed_json},
      {"control_char_nul_in_from", with_from(std::string("\"a\0b\"", 5)), E::malformed_json},
      {"control_char_newline_in_metadata", with_metadata("{\"a\":\"x\ny\"}"), E::malformed_json},
      {"bad_escape_in_key", R"({"\x":1})", E::malformed_json},
      {"lone_surrogate_escape_in_key", with_extra(R"("\uD800":1)"), E::malformed_json},
      {"malformed_beats_unknown_key", R"({"zz":1,"id":)", E::malformed_json},
      {"bad_literal_in_unknown_value", with_extra(R"("zz":tru)"), E::malformed_json},

      // Nesting depth: structural, so it wins over key and field errors.
      {"metadata_depth_33_objects", with_metadata(nested_objects(33)), E::too_deep},
      {"metadata_depth_33_arrays", with_metadata(object_of_arrays(32)), E::too_deep},
      {"metadata_depth_1000", with_metadata(nested_objects(1000)), E::too_deep},
      {"top_level_deep_array", std::string(10000, '['), E::too_deep},
      {"deep_amount_value", with_amount(std::string(40, '[') + std::string(40, ']')), E::too_deep},
      {"too_deep_beats_unknown_key", with_extra("\"zz\":" + object_of_arrays(40)), E::too_deep},

      // Keys: exactly the six names, each once, written literally.
      {"unknown_key", with_extra(R"("note":"x")"), E::unknown_key},
      {"unknown_key_case", R"({"ID":"t-1","from":"a","to":"b","amount":1})", E::unknown_key},
      {"unknown_key_empty", with_extra(R"("":1)"), E::unknown_key},
      {"duplicate_id", with_extra(R"("id":"t-2")"), E::duplicate_key},
      {"duplicate_amount_same_value", with_extra(R"("amount":2500)"), E::duplicate_key},
      {"duplicate_metadata", with_extra(R"("metadata":{},"metadata":{})"), E::duplicate_key},
      {"escaped_key_alone", R"({"\u0069d":"t-1","from":"a","to":"b","amount":1})",
       E::unknown_key},
      {"escaped_key_bypass", with_extra(R"("\u0069d":"t-2")"), E::unknown_key},
      {"escaped_key_partial", R"({"id":"t","from":"a","to":"b","amoun\u0074":1})",
       E::unknown_key},
      {"unknown_beats_earlier_duplicate",
       R"({"id":"a","id":"b","from":"x","to":"y","amount":1,"zz":1})", E::unknown_key},
      {"unknown_beats_missing", R"({"zz":1})", E::unknown_key},
      {"unknown_beats_bad_field", request("7", kFrom, kTo, "0", R"("zz":1)"), E::unknown_key},

      // Missing required keys, in the order id, from, to, amount.
      {"empty_object", "{}", E::missing_id},
      {"missing_id", R"({"from":"a","to":"b","amount":1})", E::missing_id},
      {"missing_from", R"({"id":"t","to":"b","amount":1})", E::missing_from},
      {"missing_to", R"({"id":"t","from":"a","amount":1})", E::missing_to},
      {"missing_amount", R"({"id":"t","from":"a","to":"b"})", E::missing_amount},
      {"missing_id_reported_first", R"({"amount":1})", E::missing_id},
      {"missing_beats_bad_field", R"({"id":"bad id","from":"a","to":"b"})", E::missing_amount},

      // id.
      {"id_number", with_id("123"), E::bad_id},
      {"id_null", with_id("null"), E::bad_id},
      {"id_true", with_id("true"), E::bad_id},
      {"id_array", with_id(R"(["t-1"])"), E::bad_id},
      {"id_object", with_id(R"({"v":"t-1"})"), E::bad_id},
      {"id_empty", with_id(R"("")"), E::bad_id},
      {"id_129_chars", with_id(json_string(std::string(129, 'a'))), E::bad_id},
      {"id_space", with_id(R"("t 1")"), E::bad_id},
      {"id_slash", with_id(R"("t/1")"), E::bad_id},
      {"id_at_sign", with_id(R"("t@1")"), E::bad_id},
      {"id_non_ascii", with_id("\"t\xC3\xA9\""), E::bad_id},
      {"id_unicode_escape", with_id(R"("\u0041")"), E::bad_id},
      {"id_escaped_solidus", with_id(R"("t\/1")"), E::bad_id},
      {"id_escaped_quote", with_id(R"("t\"1")"), E::bad_id},

      // from / to.
      {"from_number", with_from("1"), E::bad_from},
      {"from_empty", with_from(R"("")"), E::bad_from},
      {"from_65_chars", with_from(json_string(std::string(65, 'a'))), E::bad_from},
      {"from_bad_char", with_from(R"("acct@1")"), E::bad_from},
      {"from_escape", with_from(R"("acct\u002d1")"), E::bad_from},
      {"to_array", with_to(R"(["acct-2"])"), E::bad_to},
      {"to_null", with_to("null"), E::bad_to},
      {"to_65_chars", with_to(json_string(std::string(65, 'b'))), E::bad_to},
      {"to_bad_char", with_to(R"("acct#2")"), E::bad_to},
      {"same_account", with_to(kFrom), E::same_account},

      // Field rules run in enum order.
      {"bad_id_before_bad_from", request("1", "2", kTo, kAmount), E::bad_id},
      {"bad_from_before_bad_to", request(kId, "1", "2", kAmount), E::bad_from},
      {"same_account_before_amount", request(kId, kFrom, kFrom, "0"), E::same_account},
      {"amount_before_currency", request(kId, kFrom, kTo, "0", R"("currency":"eur")"),
       E::amount_not_positive},
      {"currency_before_metadata",
       request(kId, kFrom, kTo, kAmount, R"("currency":"eur","metadata":[])"), E::bad_currency},

      // amount.
      {"amount_zero", with_amount("0"), E::amount_not_positive},
      {"amount_minus_zero", with_amount("-0"), E::amount_not_positive},
      {"amount_minus_one", with_amount("-1"), E::amount_not_positive},
      {"amount_int64_min", with_amount("-9223372036854775808"), E::amount_not_positive},
      {"amount_leading_zero", with_amount("01"), E::amount_leading_zero},
      {"amount_leading_zeros", with_amount("007"), E::amount_leading_zero},
      {"amount_double_zero", with_amount("00"), E::amount_leading_zero},
      {"amount_negative_leading_zero", with_amount("-01"), E::amount_leading_zero},
      {"amount_float", with_amount("1.0"), E::amount_not_integer},
      {"amount_fraction", with_amount("0.5"), E::amount_not_integer},
      {"amount_leading_zero_float", with_amount("01.5"), E::amount_not_integer},
      {"amount_exponent", with_amount("1e2"), E::amount_not_integer},
      {"amount_exponent_upper", with_amount("1E2"), E::amount_not_integer},
      {"amount_exponent_negative", with_amount("1e-2"), E::amount_not_integer},
      {"amount_string", with_amount(R"("100")"), E::amount_not_integer},
      {"amount_true", with_amount("true"), E::amount_not_integer},
      {"amount_false", with_amount("false"), E::amount_not_integer},
      {"amount_null", with_amount("null"), E::amount_not_integer},
      {"amount_object", with_amount("{}"), E::amount_not_integer},
      {"amount_array", with_amount("[1]"), E::amount_not_integer},
      {"amount_2_pow_63", with_amount("9223372036854775808"), E::amount_too_large},
      {"amount_19_nines", with_amount("9999999999999999999"), E::amount_too_large},
      {"amount_2_pow_64", with_amount("18446744073709551616"), E::amount_too_large},
      {"amount_20_digits", with_amount("99999999999999999999"), E::amount_too_large},
      {"amount_1000_digits", with_amount(big_digits), E::amount_too_large},
      {"amount_plus_sign", with_amount("+1"), E::malformed_json},
      {"amount_bare_fraction", with_amount(".5"), E::malformed_json},
      {"amount_dot_without_digits", with_amount("1."), E::malformed_json},
      {"amount_bare_minus", with_amount("-"), E::malformed_json},
      {"amount_exponent_without_digits", with_amount("1e"), E::malformed_json},
      {"amount_hex", with_amount("0x10"), E::malformed_json},
      {"amount_nan", with_amount("NaN"), E::malformed_json},

      // currency.
      {"currency_lowercase", with_currency(R"("eur")"), E::bad_currency},
      {"currency_2_letters", with_currency(R"("EU")"), E::bad_currency},
      {"currency_4_letters", with_currency(R"("EURO")"), E::bad_currency},
      {"currency_empty", with_currency(R"("")"), E::bad_currency},
      {"currency_digit", with_currency(R"("E1R")"), E::bad_currency},
      {"currency_number", with_currency("978"), E::bad_currency},
      {"currency_null", with_currency("null"), E::bad_currency},
      {"currency_true", with_currency("true"), E::bad_currency},
      {"currency_array", with_currency(R"(["EUR"])"), E::bad_currency},
      {"currency_escape", with_currency(R"("\u0045UR")"), E::bad_currency},
      {"currency_non_ascii", with_currency("\"\xC3\x89UR\""), E::bad_currency},

      // metadata.
      {"metadata_array", with_metadata(R"([1,2])"), E::bad_metadata},
      {"metadata_null", with_metadata("null"), E::bad_metadata},
      {"metadata_string", with_metadata(R"("{}")"), E::bad_metadata},
      {"metadata_number", with_metadata("1"), E::bad_metadata},
      {"metadata_true", with_metadata("true"), E::bad_metadata},
      {"metadata_type_before_size", with_metadata("[\"" + std::string(5000, 'x') + "\"]"),
       E::bad_metadata},
      {"metadata_4KiB_plus_1", with_metadata(metadata_of_size(kMaxMetadataBytes + 1)),
       E::metadata_too_large},
      {"metadata_missing_value", with_metadata(R"({"a":})"), E::malformed_json},
      {"metadata_missing_colon", with_metadata(R"({"a" 1})"), E::malformed_json},
      {"metadata_trailing_comma", with_metadata(R"({"a":1,})"), E::malformed_json},
      {"metadata_array_trailing_comma", with_metadata(R"({"a":[1,]})"), E::malformed_json},
      {"metadata_unquoted_key", with_metadata(R"({a:1})"), E::malformed_json},
      {"metadata_unterminated_string", with_metadata(R"({"a":"x)"), E::malformed_json},
      {"metadata_bad_escape", with_metadata(R"({"a":"\x"})"), E::malformed_json},
      {"metadata_short_unicode_escape", with_metadata(R"({"a":"\u12"})"), E::malformed_json},
      {"metadata_bad_hex_escape", with_metadata(R"({"a":"\u12G4"})"), E::malformed_json},
      {"metadata_lone_high_surrogate", with_metadata(R"({"a":"\uD800"})"), E::malformed_json},
      {"metadata_lone_low_surrogate", with_metadata(R"({"a":"\uDC00"})"), E::malformed_json},
      {"metadata_high_then_non_low", with_metadata(R"({"a":"\uD800\u0041"})"),
       E::malformed_json},
      {"metadata_high_then_high", with_metadata(R"({"a":"\uD800\uD800"})"), E::malformed_json},
      {"metadata_number_leading_zero", with_metadata(R"({"n":01})"), E::malformed_json},
      {"metadata_number_dot", with_metadata(R"({"n":1.})"), E::malformed_json},
      {"metadata_number_bare_minus", with_metadata(R"({"n":-})"), E::malformed_json},
      {"metadata_number_plus", with_metadata(R"({"n":+1})"), E::malformed_json},
      {"metadata_bad_literal", with_metadata(R"({"n":tru})"), E::malformed_json},
      {"metadata_nan", with_metadata(R"({"n":NaN})"), E::malformed_json},
      {"metadata_unclosed", with_metadata(R"({"a":[1,2})"), E::malformed_json},
  };
}

class RequestInvalid : public ::testing::TestWithParam<Case> {};

TEST_P(RequestInvalid, RejectsWithExactError) {
  const Case& c = GetParam();
  const std::string keep = "stale";
  RequestView out{keep, keep, keep, 42, keep, keep};
  const RequestError got = parse_request(c.input, out);
  EXPECT_EQ(got, c.want) << "got " << error_code(got) << ", want " << error_code(c.want);
  // A rejected request leaves nothing behind that could be mistaken for data,
  // but for an id it could still read (answer_test.cpp has which): one from
  // the message's own bytes, never when its structure or its id was the fault.
  if (!out.id.empty()) {
    EXPECT_TRUE(is_valid_identifier(out.id, kMaxIdLength)) << out.id;
    EXPECT_TRUE(out.id.data() >= c.input.data() && out.id.data() + out.id.size() <= c.input.data() + c.input.size());
    EXPECT_GT(got, E::too_deep) << "an id read from a message whose structure is the fault";
    EXPECT_NE(got, E::missing_id);
    EXPECT_NE(got, E::bad_id);
  }
  EXPECT_TRUE(out.from.empty());
  EXPECT_TRUE(out.to.empty());
  EXPECT_EQ(out.amount, 0);
  EXPECT_TRUE(out.currency.empty());
  EXPECT_TRUE(out.metadata.empty());
}

INSTANTIATE_TEST_SUITE_P(Request, RequestInvalid, ::testing::ValuesIn(invalid_corpus()),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.name; });

TEST(RequestInvalidCorpus, IsLargeAndNamesAreUnique) {
  const auto corpus = invalid_corpus();
  EXPECT_GE(corpus.size(), 45U);
  std::set<std::string> names;
  std::set<RequestError> covered;
  for (const auto& c : corpus) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case name " << c.name;
    covered.insert(c.want);
  }
  // Every error value except ok is produced by at least one case.
  EXPECT_EQ(covered.size(), static_cast<std::size_t>(E::metadata_too_large));
  EXPECT_EQ(covered.count(E::ok), 0U);
}

// --- valid requests ---------------------------------------------------------

// The views point into `s`, so it must be a named string that outlives them.
RequestView parse_ok(std::string&&) = delete;
RequestView parse_ok(const std::string& s) {
  RequestView v;
  const RequestError e = parse_request(s, v);
  EXPECT_EQ(e, E::ok) << error_code(e) << " for: " << s.substr(0, 200);
  return v;
}

// Every field of a parsed request is the one expected (empty: absent); a
// failure prints all six, as (id, from, to, amount, currency, metadata).
void expect_fields(const RequestView& got, const RequestView& want) {
  const auto fields = [](const RequestView& v) {
    return std::tuple{v.id, v.from, v.to, v.amount, v.currency, v.metadata};
  };
  EXPECT_EQ(fields(got), fields(want));
}

TEST(RequestValid, Minimal) {
  const std::string msg = R"({"id":"t","from":"a","to":"b","amount":1})";
  expect_fields(parse_ok(msg), {"t", "a", "b", 1, "", ""});
}

TEST(RequestValid, AllFieldsFromTheDesignExample) {
  const std::string msg =
      R"({"id": "t-000123", "from": "acct-1", "to": "acct-2", "amount": 2500, )"
      R"("currency": "EUR", "metadata": {"ref": "invoice 9"}})";
  expect_fields(parse_ok(msg), {"t-000123", "acct-1", "acct-2", 2500, "EUR", R"({"ref": "invoice 9"})"});
}

TEST(RequestValid, WhitespaceEverywhere) {
  const std::string msg =
      " \t\r\n{ \t\r\n\"id\" \t:\r\n \"t-1\" ,\n\"from\"\t:\t\"a\"\r\n,"
      "\"to\":\"b\" , \"amount\"\n:\n7 ,"
      " \"currency\" : \"USD\" , \"metadata\" : { \"x\" : [ 1 , 2 ] } \t} \r\n\t ";
  expect_fields(parse_ok(msg), {"t-1", "a", "b", 7, "USD", R"({ "x" : [ 1 , 2 ] })"});
}

TEST(RequestValid, KeysInAnyOrder) {
  const std::string msg =
      R"({"metadata":{},"amount":3,"currency":"JPY","to":"b","from":"a","id":"x"})";
  expect_fields(parse_ok(msg), {"x", "a", "b", 3, "JPY", "{}"});
}

TEST(RequestValid, MaxLengthIdsAndFullAlphabet) {
  const std::string alphabet = "ABCXYZabcxyz0189._:-";
  std::string id(kMaxIdLength - alphabet.size(), 'i');
  id += alphabet;
  const std::string from(kMaxAccountIdLength, 'f');
  const std::string to = std::string(kMaxAccountIdLength - 3, 't') + ".:-";
  ASSERT_EQ(id.size(), 128U);
  ASSERT_EQ(to.size(), 64U);
  const std::string msg = request(json_string(id), json_string(from), json_string(to), "5");
  const RequestView v = parse_ok(msg);
  EXPECT_EQ(v.id, id);
  EXPECT_EQ(v.from, from);
  EXPECT_EQ(v.to, to);
}

std::int64_t amount_of(const std::string& msg) { return parse_ok(msg).amount; }

TEST(RequestValid, AmountBounds) {
  EXPECT_EQ(amount_of(with_amount("1")), 1);
  EXPECT_EQ(amount_of(with_amount("10")), 10);
  EXPECT_EQ(amount_of(with_amount("9223372036854775807")), INT64_MAX);
  EXPECT_EQ(amount_of(with_amount("9223372036854775806")), INT64_MAX - 1);
  EXPECT_EQ(amount_of(with_amount("1000000000000000000")), 1000000000000000000);
}

// The metadata view of a request carrying `meta`, copied out of the message.
std::string metadata_of(std::string_view meta) {
  const std::string msg = with_metadata(meta);
  return std::string(parse_ok(msg).metadata);
}

TEST(RequestValid, MetadataAtTheDepthLimit) {
  EXPECT_EQ(metadata_of(nested_objects(kMaxJsonDepth)), nested_objects(kMaxJsonDepth));
  EXPECT_EQ(metadata_of(object_of_arrays(kMaxJsonDepth - 1)), object_of_arrays(kMaxJsonDepth - 1));
}

TEST(RequestValid, MetadataWithEveryJsonShape) {
  const std::string meta =
      R"({"escapes":"\" \\ \/ \b \f \n \r \t","bmp":"\u00e9\u4E2D","pair":"\uD83D\uDE00",)"
      R"("raw":"é中😀","numbers":[0,-0,12,-3.25,0.5e-3,1E+2,6.02e23],)"
      R"("literals":[true,false,null],"empty":[{},[],""],"nested":{"a":{"b":[1,{"c":2}]}}})";
  EXPECT_EQ(metadata_of(meta), meta);
}

TEST(RequestValid, MetadataKeptVerbatim) {
  const std::string meta = "{ \"b\" :\t2 ,\n\"a\":[ 1,2 ] ,\"u\":\"\\u0041\" }";
  const std::string msg = with_metadata(meta);
  const RequestView v = parse_ok(msg);
  const std::size_t at = msg.find(meta);
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(v.metadata, std::string_view(msg).substr(at, meta.size()));
  // A view into the caller's bytes, not a copy.
  EXPECT_EQ(v.metadata.data(), msg.data() + at);
  EXPECT_EQ(v.id.data(), msg.data() + msg.find("t-1"));
}

TEST(RequestValid, MetadataDuplicateKeysAreAllowed) {
  // Metadata is opaque: only the top level has the duplicate-key rule.
  EXPECT_EQ(metadata_of(R"({"a":1,"a":2})"), R"({"a":1,"a":2})");
}

TEST(RequestValid, MetadataMayUseTopLevelKeyNames) {
  const std::string meta = R"({"id":"other","amount":-1,"metadata":null})";
  EXPECT_EQ(metadata_of(meta), meta);
}

TEST(RequestValid, SizeLimitsAreInclusive) {
  const std::string meta = metadata_of_size(kMaxMetadataBytes);
  ASSERT_EQ(meta.size(), kMaxMetadataBytes);
  EXPECT_EQ(metadata_of(meta), meta);
  const std::string msg = padded_to(valid(), kMaxRequestBytes);
  ASSERT_EQ(msg.size(), kMaxRequestBytes);
  EXPECT_EQ(amount_of(msg), 2500);
}

// --- payload hash -----------------------------------------------------------

std::uint64_t hash_of(const std::string& s) { return payload_hash(parse_ok(s)); }

TEST(RequestPayloadHash, IgnoresIdAndWhitespaceOutsideMetadata) {
  const std::uint64_t h = hash_of(
      R"({"id":"t-1","from":"a","to":"b","amount":9,"currency":"EUR","metadata":{"k":"v"}})");
  EXPECT_EQ(h, hash_of(R"({"id":"t-2","from":"a","to":"b","amount":9,"currency":"EUR",)"
                       R"("metadata":{"k":"v"}})"));
  EXPECT_EQ(h, hash_of(" {\n\"metadata\" : {\"k\":\"v\"} ,\t\"currency\":\"EUR\", \"amount\" : 9,"
                       " \"to\":\"b\", \"from\":\"a\", \"id\":\"other-id\" }\r\n"));
}

TEST(RequestPayloadHash, DiffersWhenAnyFieldDiffers) {
  const std::string base =
      R"("from":"a","to":"b","amount":9,"currency":"EUR","metadata":{"k":"v"})";
  const std::uint64_t h = hash_of(R"({"id":"t",)" + base + "}");
  const std::vector<std::string> others = {
      R"({"id":"t","from":"c","to":"b","amount":9,"currency":"EUR","metadata":{"k":"v"}})",
      R"({"id":"t","from":"a","to":"c","amount":9,"currency":"EUR","metadata":{"k":"v"}})",
      R"({"id":"t","from":"b","to":"a","amount":9,"currency":"EUR","metadata":{"k":"v"}})",
      R"({"id":"t","from":"a","to":"b","amount":10,"currency":"EUR","metadata":{"k":"v"}})",
      R"({"id":"t","from":"a","to":"b","amount":9,"currency":"USD","metadata":{"k":"v"}})",
      R"({"id":"t","from":"a","to":"b","amount":9,"metadata":{"k":"v"}})",
      R"({"id":"t","from":"a","to":"b","amount":9,"currency":"EUR","metadata":{"k":"w"}})",
      R"({"id":"t","from":"a","to":"b","amount":9,"currency":"EUR","metadata":{"k": "v"}})",
      R"({"id":"t","from":"a","to":"b","amount":9,"currency":"EUR","metadata":{}})",
      R"({"id":"t","from":"a","to":"b","amount":9,"currency":"EUR"})",
  };
  std::set<std::uint64_t> seen{h};
  for (const auto& o : others) {
    EXPECT_TRUE(seen.insert(hash_of(o)).second) << o;
  }
}

TEST(RequestPayloadHash, FieldBoundariesCannotShift) {
  RequestView a;
  a.from = "ab";
  a.to = "c";
  a.amount = 1;
  RequestView b = a;
  b.from = "a";
  b.to = "bc";
  EXPECT_NE(payload_hash(a), payload_hash(b));
  RequestView c = a;
  c.currency = "EUR";
  RequestView d = a;
  d.metadata = "EUR";
  EXPECT_NE(payload_hash(c), payload_hash(d));
}

TEST(RequestPayloadHash, IsStableAcrossBuilds) {
  // Hashes are stored with transfers: these values (FNV-1a 64 over
  // length-prefixed fields, computed independently) must never change.
  EXPECT_EQ(hash_of(R"({"id": "t-000123", "from": "acct-1", "to": "acct-2", "amount": 2500,)"
                    R"( "currency": "EUR", "metadata": {"ref": "invoice 9"}})"),
            0x59d2c06af64cf989ULL);
  EXPECT_EQ(hash_of(R"({"id":"x","from":"a","to":"b","amount":1})"), 0xda0069001780d675ULL);
}

// --- error codes ------------------------------------------------------------

struct Named {
  RequestError e;
  std::string_view name;
};

constexpr Named kAllErrors[] = {
    {E::ok, "ok"},
    {E::empty, "empty"},
    {E::too_large, "too_large"},
    {E::not_utf8, "not_utf8"},
    {E::malformed_json, "malformed_json"},
    {E::not_object, "not_object"},
    {E::trailing_data, "trailing_data"},
    {E::too_deep, "too_deep"},
    {E::unknown_key, "unknown_key"},
    {E::duplicate_key, "duplicate_key"},
    {E::missing_id, "missing_id"},
    {E::missing_from, "missing_from"},
    {E::missing_to, "missing_to"},
    {E::missing_amount, "missing_amount"},
    {E::bad_id, "bad_id"},
    {E::bad_from, "bad_from"},
    {E::bad_to, "bad_to"},
    {E::same_account, "same_account"},
    {E::amount_not_integer, "amount_not_integer"},
    {E::amount_leading_zero, "amount_leading_zero"},
    {E::amount_not_positive, "amount_not_positive"},
    {E::amount_too_large, "amount_too_large"},
    {E::bad_currency, "bad_currency"},
    {E::bad_metadata, "bad_metadata"},
    {E::metadata_too_large, "metadata_too_large"},
};

TEST(RequestErrorCode, EqualsTheEnumNameAndIsUnique) {
  std::set<std::string_view> codes;
  std::set<std::string_view> messages;
  for (std::size_t i = 0; i < std::size(kAllErrors); ++i) {
    const Named& n = kAllErrors[i];
    // The table lists every value in declaration order.
    ASSERT_EQ(static_cast<std::size_t>(n.e), i);
    const std::string_view code = error_code(n.e);
    EXPECT_EQ(code, n.name);
    EXPECT_FALSE(code.empty());
    EXPECT_EQ(code.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_"),
              std::string_view::npos)
        << code;
    EXPECT_TRUE(codes.insert(code).second) << "duplicate code " << code;
    const std::string_view message = error_message(n.e);
    EXPECT_FALSE(message.empty()) << code;
    EXPECT_TRUE(messages.insert(message).second) << "duplicate message for " << code;
  }
}

TEST(RequestErrorCode, TableCoversTheWholeEnum) {
  // If this fails, a value was added to RequestError: add it to kAllErrors.
  const auto past_end =
      static_cast<RequestError>(static_cast<std::uint8_t>(E::metadata_too_large) + 1);
  EXPECT_EQ(error_code(past_end), "unknown");
}

// Upstream teams read the codes in docs/messages.md: each one is there, in
// the order validation reports them, as a table row.
TEST(RequestErrorCode, DocsMessagesListsEveryCodeInOrder) {
  std::ifstream in(std::string(SAGA_SOURCE_DIR) + "/docs/messages.md");
  ASSERT_TRUE(in) << "docs/messages.md not found";
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t last = 0;
  for (const Named& n : kAllErrors) {
    if (n.e == E::ok) continue;
    const RequestError e = n.e;
    const std::string row = "| `" + std::string(error_code(e)) + "` |";
    const std::size_t at = doc.find(row);
    ASSERT_NE(at, std::string::npos) << "docs/messages.md has no row for " << error_code(e);
    EXPECT_GT(at, last) << error_code(e) << " is out of order in docs/messages.md";
    last = at;
  }
}

TEST(RequestErrorCode, ExampleFromTheContract) {
  EXPECT_EQ(error_code(E::amount_leading_zero), "amount_leading_zero");
  EXPECT_EQ(error_message(E::amount_leading_zero), "amount must not have leading zeros");
}

// --- identifiers ------------------------------------------------------------

TEST(RequestIdentifier, AlphabetAndLength) {
  EXPECT_TRUE(is_valid_identifier("aZ09._:-", 8));
  EXPECT_FALSE(is_valid_identifier("aZ09._:-", 7));
  EXPECT_FALSE(is_valid_identifier("", 8));
  EXPECT_TRUE(is_valid_identifier("x", 1));
  for (const char c : std::string_view(" /\\\"'@#+,;=?!~`*()[]{}<>|$%^&\t\n\x7f\xc3")) {
    EXPECT_FALSE(is_valid_identifier(std::string(1, c), 8)) << static_cast<int>(c);
  }
}

}  // namespace
}  // namespace sagapool
