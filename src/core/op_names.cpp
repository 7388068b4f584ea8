// The ops' names as numpy spells them (core/array_ops.hpp): the kernels' messages, tape nodes.

#include "shard/core/array_ops.hpp"

namespace shard::detail {

const char* binary_op_name(BinaryOp op) {
  static const char* kNames[] = {"add",   "subtract", "multiply", "divide", "maximum",      "minimum",
                                 "power", "and",      "or",       "xor",    "floor_divide", "remainder"};
  return kNames[static_cast<int>(op)];
}
const char* unary_op_name(UnaryOp op) {
  static const char* kNames[] = {"exp",   "log",  "sin",         "cos",        "tanh",     "relu",
                                 "sqrt",  "abs",  "negative",    "square",     "log1p",    "expm1",
                                 "rsqrt", "sign", "sigmoid",     "reciprocal", "floor",    "ceil",
                                 "round", "erf",  "logical_not", "gelu",       "gelu_grad"};
  return kNames[static_cast<int>(op)];
}
const char* reduce_op_name(ReduceKind kind) {
  static const char* kNames[] = {"sum", "mean", "max", "min", "prod"};
  return kNames[static_cast<int>(kind)];
}

}  // namespace shard::detail
