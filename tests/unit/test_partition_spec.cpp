// PartitionSpec: construction, printing, parsing and equality.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shard/error.hpp"
#include "shard/sharding/partition_spec.hpp"

namespace shard {
namespace {

using Axes = std::vector<std::string>;

TEST(PartitionSpec, Entries) {
  const P spec("a", None, {"b", "c"});
  ASSERT_EQ(spec.size(), 3);
  EXPECT_EQ(spec[0].axes(), Axes{"a"});
  EXPECT_TRUE(spec[1].is_none());
  EXPECT_EQ(spec[2].axes(), (Axes{"b", "c"}));
  EXPECT_FALSE(spec[2].is_none());
  // Past the end: None.
  EXPECT_TRUE(spec[3].is_none());
  EXPECT_TRUE(spec[100].is_none());
  EXPECT_TRUE(spec[-1].is_none());
  EXPECT_EQ(spec.axes(), (Axes{"a", "b", "c"}));
  EXPECT_EQ(P().size(), 0);
  EXPECT_TRUE(P().axes().empty());
  const P from_vector(std::vector<SpecEntry>{SpecEntry(std::string("x")), SpecEntry(Axes{"y", "z"})});
  EXPECT_EQ(from_vector.axes(), (Axes{"x", "y", "z"}));
}

TEST(PartitionSpec, EntryToString) {
  EXPECT_EQ(SpecEntry().to_string(), "None");
  EXPECT_EQ(SpecEntry(None).to_string(), "None");
  EXPECT_EQ(SpecEntry("a").to_string(), "'a'");
  EXPECT_EQ(SpecEntry({"b", "c"}).to_string(), "('b','c')");
  EXPECT_EQ(SpecEntry({"x", "y", "z"}).to_string(), "('x','y','z')");
}

TEST(PartitionSpec, ToString) {
  EXPECT_EQ(P("a", None, {"b", "c"}).to_string(), "P('a', None, ('b','c'))");
  EXPECT_EQ(P().to_string(), "P()");
  EXPECT_EQ(P("a").to_string(), "P('a')");
  EXPECT_EQ(P(None, "b").to_string(), "P(None, 'b')");
  EXPECT_EQ(P("a", "b", "c", "d", "e").to_string(), "P('a', 'b', 'c', 'd', 'e')");
}

TEST(PartitionSpec, EqualityIgnoresTrailingNones) {
  EXPECT_EQ(P("a"), P("a", None));
  EXPECT_EQ(P("a", None, None), P("a"));
  EXPECT_EQ(P(), P(None));
  EXPECT_EQ(P(), P(None, None, None));
  EXPECT_NE(P("a"), P(None, "a"));
  EXPECT_NE(P("a", "b"), P("b", "a"));
  EXPECT_NE(P(SpecEntry{"a", "b"}), P(SpecEntry{"b", "a"}));  // order inside a tuple matters
  EXPECT_NE(P(SpecEntry{"a", "b"}), P("a", "b"));
  EXPECT_NE(P("a"), P());
  EXPECT_NE(P("a", None, "c"), P("a"));
}

struct ParseCase {
  std::string text;
  std::vector<Axes> entries;  // empty Axes = None
};

P make_spec(const std::vector<Axes>& entries) {
  std::vector<SpecEntry> e;
  for (const auto& a : entries) e.emplace_back(a);
  return P(std::move(e));
}

TEST(PartitionSpec, ParseForms) {
  const std::vector<ParseCase> cases = {
      {"P('a', None, ('b','c'))", {{"a"}, {}, {"b", "c"}}},
      {"PartitionSpec('a')", {{"a"}}},
      {"(a, None)", {{"a"}, {}}},
      {"('a', None)", {{"a"}, {}}},
      {"a,None,(b,c)", {{"a"}, {}, {"b", "c"}}},
      {"P()", {}},
      {"PartitionSpec()", {}},
      {"", {}},
      {"P(None)", {{}}},
      {"P(\"a\", \"b\")", {{"a"}, {"b"}}},
      {"P('a',)", {{"a"}}},
      {"P(('a','b','c'))", {{"a", "b", "c"}}},
      {"P(('a',), None)", {{"a"}, {}}},
      {"P(data_parallel, model-axis)", {{"data_parallel"}, {"model-axis"}}},
      {"  P  (  'a' ,  None ,  (  'b' ,  'c'  )  )  ", {{"a"}, {}, {"b", "c"}}},
      {"\tPartitionSpec(\n'a',\nNone\n)\n", {{"a"}, {}}},
      {" a , None , ( b , c ) ", {{"a"}, {}, {"b", "c"}}},
      {"P( )", {}},
  };
  for (const auto& c : cases) {
    P got;
    ASSERT_NO_THROW(got = P::parse(c.text)) << "text: " << c.text;
    ASSERT_EQ(got.size(), static_cast<int>(c.entries.size())) << "text: " << c.text;
    for (std::size_t i = 0; i < c.entries.size(); ++i)
      EXPECT_EQ(got[static_cast<int>(i)].axes(), c.entries[i]) << "text: " << c.text << " entry " << i;
    EXPECT_EQ(got, make_spec(c.entries)) << "text: " << c.text;
  }
}

TEST(PartitionSpec, QuotedNoneIsAnAxisName) {
  const P spec = P::parse("P('None', None)");
  ASSERT_EQ(spec.size(), 2);
  EXPECT_EQ(spec[0].axes(), Axes{"None"});
  EXPECT_TRUE(spec[1].is_none());
}

TEST(PartitionSpec, ParseRoundTripsToString) {
  const std::vector<P> specs = {
      P(),
      P("a"),
      P(None, "b"),
      P("a", None, {"b", "c"}),
      P({"x", "y", "z"}, None, None, "w"),
      P(None, None),
      P("a", "b", "c", "d", "e"),
      P("it's", {"b", "c'd"}),  // a name holding a single quote prints in double quotes
  };
  for (const auto& s : specs) {
    const std::string text = s.to_string();
    const P back = P::parse(text);
    EXPECT_EQ(back, s) << text;
    EXPECT_EQ(back.size(), s.size()) << text;  // parse keeps explicit trailing Nones
    EXPECT_EQ(back.to_string(), text);
  }
}

TEST(PartitionSpec, NameWithTheOtherQuoteRoundTrips) {
  // Found by fuzz/fuzz_partition_spec: "b',')" is one axis name, printed once as 'b',')'.
  const P spec = P::parse("\"b',')\"");
  ASSERT_EQ(spec.size(), 1);
  EXPECT_EQ(spec[0].axes(), Axes{"b',')"});
  EXPECT_EQ(P::parse(spec.to_string()), spec) << spec.to_string();
}

TEST(PartitionSpec, ParseErrors) {
  const std::vector<std::string> bad = {
      "P('a'",          // unclosed
      "P(('a',None))",  // None inside a tuple
      "P(,)",           // empty entry
      "P('a' 'b')",     // missing comma
      "P('a'))",        // trailing text
      "P('')",          // empty axis name
      "P('a)",          // unterminated quote
      "P(('a', 'b')",   // unclosed tuple and spec
      "P(a,,b)",        // empty entry in the middle
      "a b",           "P('a') x",
  };
  for (const auto& text : bad) {
    EXPECT_THROW(P::parse(text), ValueError) << "text: " << text;
  }
  // The message quotes the text.
  try {
    P::parse("P(,)");
    FAIL() << "no exception";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("P(,)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shard
