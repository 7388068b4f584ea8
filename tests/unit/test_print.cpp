// to_string against numpy 1.24's str() of the same arrays (the expected texts were printed by
// numpy): float formats (shortest digits capped at 8, aligned points, scientific notation,
// nan/inf), integers, bools, line wrapping at 75 characters, summaries of large arrays, scalars.

#include <gtest/gtest.h>

#include <cmath>

#include "shard/array/print.hpp"
#include "shard/core/tensor_ops.hpp"

namespace shard {
namespace {

TEST(Print, MatchesNumpyStr) {
  EXPECT_EQ(to_string(arange<float>(8.f) / 28.f),
            "[0.         0.03571429 0.07142857 0.10714286 0.14285715 0.17857143\n 0.21428572 0.25      ]");
  EXPECT_EQ(to_string(Tensor<double>({4}, std::vector<double>{1.5, -2.25, 1000.125, 3.0})),
            "[   1.5     -2.25  1000.125    3.   ]");
  EXPECT_EQ(to_string(Tensor<double>({4}, std::vector<double>{1e-5, 2.5e-5, 1.0, NAN})),
            "[1.0e-05 2.5e-05 1.0e+00     nan]");
  EXPECT_EQ(to_string(Tensor<double>({3}, std::vector<double>{1e8, 1.0, -3.5})), "[ 1.0e+08  1.0e+00 -3.5e+00]");
  EXPECT_EQ(to_string(Tensor<float>({4}, std::vector<float>{1.f, -INFINITY, NAN, 0.5f})), "[ 1.  -inf  nan  0.5]");
  EXPECT_EQ(to_string(Tensor<std::int32_t>({2, 3}, std::vector<std::int32_t>{-5, 10, 300, 7, -1000, 2})),
            "[[   -5    10   300]\n [    7 -1000     2]]");
  EXPECT_EQ(to_string(Tensor<bool>({2, 2}, std::vector<bool>{true, false, false, true})), "[[ True False]\n [False  True]]");
  EXPECT_EQ(to_string(arange<double>(40.0) / 7.0),
            "[0.         0.14285714 0.28571429 0.42857143 0.57142857 0.71428571\n 0.85714286 1.         1.14285714 "
            "1.28571429 1.42857143 1.57142857\n 1.71428571 1.85714286 2.         2.14285714 2.28571429 2.42857143\n "
            "2.57142857 2.71428571 2.85714286 3.         3.14285714 3.28571429\n 3.42857143 3.57142857 3.71428571 "
            "3.85714286 4.         4.14285714\n 4.28571429 4.42857143 4.57142857 4.71428571 4.85714286 5.\n "
            "5.14285714 5.28571429 5.42857143 5.57142857]");
  EXPECT_EQ(to_string(arange<std::int64_t>(2000).reshaped({40, 50})),
            "[[   0    1    2 ...   47   48   49]\n [  50   51   52 ...   97   98   99]\n [ 100  101  102 ...  147  148  "
            "149]\n ...\n [1850 1851 1852 ... 1897 1898 1899]\n [1900 1901 1902 ... 1947 1948 1949]\n [1950 1951 1952 "
            "... 1997 1998 1999]]");
  EXPECT_EQ(to_string(Tensor<double>({3}, std::vector<double>{0.1, 0.123456789123, 2.0 / 3.0})),
            "[0.1        0.12345679 0.66666667]");
  EXPECT_EQ(to_string(Tensor<float>({0, 3})), "[]");
}

TEST(Print, ScalarsLikeNumpyScalars) {
  EXPECT_EQ(to_string(Tensor<float>(Shape{}, 1.f)), "1.0");
  EXPECT_EQ(to_string(Tensor<double>(Shape{}, 0.1)), "0.1");
  EXPECT_EQ(to_string(Tensor<float>(Shape{}, 1e-5f)), "1e-05");
  EXPECT_EQ(to_string(Tensor<double>(Shape{}, 1.5e16)), "1.5e+16");
  EXPECT_EQ(to_string(Tensor<std::int32_t>(Shape{}, 7)), "7");
  EXPECT_EQ(to_string(Tensor<bool>(Shape{}, true)), "True");
  EXPECT_EQ(to_string(Tensor<float>(Shape{}, 28.f)), "28.0");
  EXPECT_EQ(to_string(Tensor<double>(Shape{}, 123456.789)), "123456.789");
}

}  // namespace
}  // namespace shard
