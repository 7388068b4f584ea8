#pragma once
/// \file What a primitive is: the shape every entry of the op table has (DESIGN.md "Ops: one op
/// table, one driver, two views"), and its sharding rule in factor form.
///
/// A primitive is a small struct (its parameters are its members) that derives from
/// `Primitive` and gives, side by side, as JAX keeps a primitive's rules in one paragraph:
///
///   struct Hypot : shard::Primitive {
///     const char* name() const { return "hypot"; }
///     static const shard::FactorRule& rule() { static const shard::FactorRule r("...,...->..."); return r; }
///     template <shard::Dtype T>                                   // the local kernel on blocks
///     shard::Tensor<T> kernel(const shard::Tensor<T>& a, const shard::Tensor<T>& b) const;
///     template <shard::ArrayLike X>                               // its VJP (optional)
///     shard::KernelVjp<X, X> vjp(const shard::VjpNeed& need, const X& out, const X& a, const X& b) const;
///   };
///
/// and `shard::bind(Hypot{}, a, b)` (array/driver.hpp; the caller's line is kept for messages)
/// runs it on Tensors or ShardedArrays. The driver does the rest: it checks the operands, plans
/// the result's sharding and the operands' reshards from rule() (cached by the operands'
/// signatures), runs kernel() on each device's blocks, closes with a collective over the axes
/// that split a reduced factor and records vjp() when a tape records. vjp() returns a closure
/// that maps the result's cotangent to the operands' (`shard::cotangents(da, db)`, or a
/// `shard::Cotangents<X>` with an empty entry where need[i] is false); it runs on the same ops,
/// so the backward pass communicates as the forward's rules say. A primitive without vjp()
/// raises when differentiated, as JAX does for a primitive without a differentiation rule.
/// In the backward pass the closure's `need` also says which inputs are parameters
/// (need.leaf(i)) and where each input's cotangent is kept (need.input<X>(i)->sharding, a
/// gradient's grad_sharding); a parameter's cotangent whose reduction is still in flight may be
/// returned with Cotangents::defer (matmul's VJP: ops/matmul.hpp).
///
/// Optional members:
///   - `static constexpr ReduceKind closing` or `ReduceKind closing_kind() const`: the
///     collective that combines the partial blocks of a reduced factor (psum by default);
///   - `partial(blocks...)` and `finalize(combined)`: the partial results that cross devices
///     (float64 partials of a float32 sum) and the step after the collective;
///   - `sharded(arrays...)`: the sharded view of a primitive whose layout rule is not a factor
///     rule (reshape, slice, take: ops/shape.hpp) or whose communication is not one closing
///     collective (a scan's block totals, argmax's two steps); such a primitive needs no rule()
///     when it also sets kernel_validates (the Tensor view otherwise checks with rule());
///   - `forward_vjp(need, xs...)`: the result and its VJP from one call, for a kernel that keeps
///     what its VJP reads as it runs (softmax's output, attention's probabilities: ops/nn.hpp);
///   - `across(x)`: the whole op for a primitive that moves its operand between the views
///     (ShardedArray::to_host, uncommitted): the result is across()'s, of the other view, and
///     vjp(need, out, x) maps its cotangent back;
///   - `view(x)`: under a tape, the Tensor result that shares x's memory (a reshape);
///   - over a list of operands (concatenate): kernel(xs), sharded(xs), vjp(out, xs), bound
///     with `shard::bind_list(p, xs)`;
///   - `static constexpr bool kernel_validates`: the kernel checks its operands itself (the
///     Tensor view then skips the rule's check);
///   - `static constexpr bool linear_local`: a linear op without communication (the transpose
///     of pvary passes through its node).
///   - `batch(where, size, args...)`: the batching rule (vmap; ops/batching.hpp): each argument a
///     `BatchArg<X>` (the operand's physical array and its batch dim, -1 when not batched), the
///     result a `BatchOut<X>` (the physical result and its batch dim), written with ops on the
///     physical arrays; `batch_list(where, rank, xs)` for a list primitive (every operand with the
///     batch dim first). Every primitive of the library has one (tests/check_batching_rules.py);
///     without one a primitive raises under vmap, or runs as a loop when the vmap asks for it.
///   - `span(n, const A* a..., R* out)`: the kernel on n contiguous elements of operands of the
///     result's shape, for jit's elementwise fusion (jit/fuse.hpp), which runs a chain of such
///     primitives tile by tile in one pass over memory.

#include <cstdint>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "shard/core/box.hpp"
#include "shard/error.hpp"  // shard::source_location

namespace shard {

/// A sharding rule in factor form (Shardy's `([i, k], [k, j]) -> ([i, j])`, DTensor's
/// "mk,kn->mn"): one letter per dim of each operand and of the result, operands separated by
/// commas. A dim of the result and the operand dims with the same letter are split over the
/// same mesh axes. A letter the result lacks is a reduced factor: each device combines its
/// blocks locally and one collective combines the partial results over the mesh axes that
/// split it. "..." stands for leading dims that broadcast numpy-style across operands (size-1
/// and missing dims broadcast): elementwise ops are "...,...->...", a row reduction "...j->...".
/// A '1' in the result is a size-1 dim no operand has (a reduction with keepdims: "ij->i1").
class FactorRule {
 public:
  /// Parses `text`; throws ValueError on a malformed rule (a result letter no operand has,
  /// "..." in the result but not in an operand, a letter twice in one operand).
  explicit FactorRule(std::string_view text);

  const std::string& text() const { return text_; }
  int arity() const { return static_cast<int>(operands_.size()); }
  /// Every term is "..." alone: an elementwise op with numpy broadcasting.
  bool elementwise() const { return elementwise_; }

  /// The rule applied to operand shapes: one factor id per dim (-1: a dim that broadcasts
  /// from size 1 or is absent in the result), the sizes of the factors and the result shape.
  struct Factors {
    std::vector<std::vector<int>> operands;
    std::vector<int> result;
    std::vector<std::int64_t> sizes;
    std::vector<bool> reduced;  // per factor: not in the result
    Shape result_shape;
    bool has_reduced() const;
  };
  /// Throws ShapeError naming `op` and the caller's line when the ranks or sizes do not fit.
  Factors expand(const std::vector<const Shape*>& shapes, const char* op,
                 const shard::source_location& where) const;

 private:
  struct Term {
    bool ellipsis = false;
    std::string letters;  // the named dims after the ellipsis
  };
  std::string text_;
  std::vector<Term> operands_;
  Term result_;
  bool elementwise_ = false;
};

/// The base of every primitive (a marker: the driver binds only what derives from it).
struct Primitive {};

/// "op (called at file:line)": how an error names the call site.
std::string located(const char* op, const shard::source_location& where);

}  // namespace shard
