#pragma once
/// \file Parameter trees (JAX's pytrees, `jax.tree_util`): one protocol for everything that takes
/// "the parameters": grad / value_and_grad / vjp, the optimizers (init, update), checkpoints and
/// device_put.
///
/// A tree is
///   - a leaf: a `Tensor<T>` or a `ShardedArray<T>`;
///   - a `std::vector<Tree>`, a `std::map<std::string, Tree>`, a `std::tuple<Tree...>` or a
///     `std::pair<Tree, Tree>`;
///   - a struct registered in one line after its definition, in its own namespace:
///
///         struct Layer { ShardedArray<float> w, b; };
///         SHARD_TREE(Layer, w, b)                      // every data member, in order
///         struct Model { std::vector<Layer> layers; ShardedArray<float> head; int vocab; };
///         SHARD_TREE(Model, layers, head, vocab)       // nested; `vocab` is static data
///
///     (an aggregate whose data members are all listed, in declaration order: the list is a
///     structured binding, so a missing member does not compile);
///   - anything else (an int, a string, a Config): static data, copied as is by tree_map and
///     never a leaf, as JAX's `static` fields.
/// Leaves are visited in a fixed order on every rank: vector and tuple elements by position,
/// map entries by key, struct members in declaration order. A leaf's path prints as JAX's
/// `keystr`: `.layers[0].w`, `['w1']`.

#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shard/core/array_ops.hpp"
#include "shard/error.hpp"

namespace shard {

/// Where a leaf sits in its tree: the keys from the root (vector / tuple index, map key,
/// struct member).
class TreePath {
 public:
  enum class Kind { kIndex, kKey, kField };
  struct Entry {
    Kind kind;
    std::string text;
  };
  /// JAX's keystr: `.layers[0].w`, `['w1']`, `[2]`; "" for the root.
  std::string to_string() const {
    std::string s;
    for (const Entry& e : entries_) {
      if (e.kind == Kind::kIndex)
        s += "[" + e.text + "]";
      else if (e.kind == Kind::kKey)
        s += "['" + e.text + "']";
      else
        s += "." + e.text;
    }
    return s;
  }
  /// `prefix` and the keys joined by '.': `params.layers.0.w` (checkpoint array names); the
  /// prefix alone for the root.
  std::string dotted(const std::string& prefix = "") const {
    std::string s = prefix;
    for (const Entry& e : entries_) s += (s.empty() ? "" : ".") + e.text;
    return s;
  }
  const std::vector<Entry>& entries() const { return entries_; }

  void push(Kind k, std::string text) { entries_.push_back(Entry{k, std::move(text)}); }
  void pop() { entries_.pop_back(); }

 private:
  std::vector<Entry> entries_;
};

namespace detail {

/// What SHARD_TREE registers: the member names as written and a function from the struct to a
/// std::tuple of references to its members.
template <typename Tie>
struct StructFields {
  const char* names;
  Tie tie;
};
template <typename Tie>
StructFields(const char*, Tie) -> StructFields<Tie>;

/// "w, b,  c" -> {"w", "b", "c"}.
inline std::vector<std::string> split_field_names(const char* names) {
  std::vector<std::string> out(1);
  for (const char* c = names; *c; ++c) {
    if (*c == ',')
      out.emplace_back();
    else if (*c != ' ' && *c != '\t' && *c != '\n')
      out.back() += *c;
  }
  return out;
}

template <typename T>
concept RegisteredTree = requires(const T* p) {
  shard_tree_fields(p);
};

template <typename T>
struct is_std_vector : std::false_type {};
template <typename E, typename A>
struct is_std_vector<std::vector<E, A>> : std::true_type {};
template <typename T>
struct is_string_map : std::false_type {};
template <typename E, typename C, typename A>
struct is_string_map<std::map<std::string, E, C, A>> : std::true_type {};
template <typename T>
struct is_tuple_like : std::false_type {};
template <typename... E>
struct is_tuple_like<std::tuple<E...>> : std::true_type {};
template <typename A, typename B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};

template <typename T>
auto struct_fields() {
  return shard_tree_fields(static_cast<const T*>(nullptr));
}

/// The type of a tree's first leaf (std::type_identity<void> when it has none): what the
/// optimizers' state holds.
template <typename T>
constexpr auto first_leaf();
template <typename Tuple, std::size_t I = 0>
constexpr auto first_leaf_of_tuple() {
  if constexpr (I == std::tuple_size_v<Tuple>) {
    return std::type_identity<void>{};
  } else {
    using R = decltype(first_leaf<std::remove_cvref_t<std::tuple_element_t<I, Tuple>>>());
    if constexpr (!std::is_same_v<R, std::type_identity<void>>)
      return R{};
    else
      return first_leaf_of_tuple<Tuple, I + 1>();
  }
}
template <typename T>
constexpr auto first_leaf() {
  if constexpr (ArrayLike<T>)
    return std::type_identity<T>{};
  else if constexpr (is_std_vector<T>::value)
    return first_leaf<typename T::value_type>();
  else if constexpr (is_string_map<T>::value)
    return first_leaf<typename T::mapped_type>();
  else if constexpr (is_tuple_like<T>::value)
    return first_leaf_of_tuple<T>();
  else if constexpr (RegisteredTree<T>)
    return first_leaf_of_tuple<decltype(struct_fields<T>().tie(std::declval<T&>()))>();
  else
    return std::type_identity<void>{};
}

}  // namespace detail

/// Calls f(path, leaf, leaves...) for each leaf of `tree` and the leaves at the same places of
/// `rest` (trees of the same structure: ValueError naming the first place they differ).
/// Leaves are passed as the trees are (mutable when the trees are).
template <typename F, typename Tree, typename... Rest>
void tree_for_each_with_path(F&& f, Tree&& tree, Rest&&... rest);

namespace detail {

/// Whether a type holds an array somewhere: a container without one (std::vector<bool>,
/// std::map<std::string, int>, a pair of ints) is static data like any other value, copied by
/// tree_map and never walked (as JAX treats a tuple of ints it finds in a pytree's aux data).
template <typename T>
constexpr bool has_leaves = !std::is_same_v<decltype(first_leaf<T>()), std::type_identity<void>>;

/// A node's kind, for trees visited together: 0 static data, 1 leaf, 2 vector, 3 map, 10 + n a
/// tuple / pair of n elements, 1000 + n a SHARD_TREE struct of n members.
template <typename T>
constexpr int node_kind() {
  if constexpr (ArrayLike<T>)
    return 1;
  else if constexpr (!has_leaves<T>)
    return 0;
  else if constexpr (is_std_vector<T>::value)
    return 2;
  else if constexpr (is_string_map<T>::value)
    return 3;
  else if constexpr (is_tuple_like<T>::value)
    return 10 + static_cast<int>(std::tuple_size_v<T>);
  else if constexpr (RegisteredTree<T>)
    return 1000 + static_cast<int>(std::tuple_size_v<decltype(struct_fields<T>().tie(std::declval<T&>()))>);
  else
    return 0;
}

[[noreturn]] inline void tree_mismatch(const TreePath& path, const std::string& what) {
  raise<ValueError>("trees of different structure at ",
                    path.to_string().empty() ? "the root" : path.to_string(), ": ", what);
}

inline void check_size(const TreePath& path, const char* what, const char* of, std::size_t n,
                       std::size_t other) {
  if (n != other)
    tree_mismatch(path, std::string(what) + " of " + std::to_string(n) + " " + of + " against one of " +
                            std::to_string(other));
}

template <typename F, typename T, typename... Ts>
void visit_tree(F& f, TreePath& path, T& t, Ts&... ts) {
  using U = std::remove_cvref_t<T>;
  static_assert(
      ((node_kind<U>() == node_kind<std::remove_cvref_t<Ts>>()) && ...),
      "trees passed together must have the same structure (a leaf against a leaf, a vector against a "
      "vector, ...)");
  if constexpr (node_kind<U>() == 0) {
    // static data: no leaves (a visitor that asks for it sees it: jit's signature)
    if constexpr (requires { f.on_static(std::as_const(path), std::as_const(t)); })
      f.on_static(std::as_const(path), std::as_const(t));
  } else if constexpr (ArrayLike<U>) {
    f(std::as_const(path), t, ts...);
  } else if constexpr (is_std_vector<U>::value) {
    (check_size(path, "a vector", "elements", t.size(), ts.size()), ...);
    if constexpr (requires { f.on_container(std::as_const(path), std::as_const(t)); })
      f.on_container(std::as_const(path), std::as_const(t));  // (jit's signature: its length)
    for (std::size_t i = 0; i < t.size(); ++i) {
      path.push(TreePath::Kind::kIndex, std::to_string(i));
      visit_tree(f, path, t[i], ts[i]...);
      path.pop();
    }
  } else if constexpr (is_string_map<U>::value) {
    (check_size(path, "a map", "keys", t.size(), ts.size()), ...);
    if constexpr (requires { f.on_container(std::as_const(path), std::as_const(t)); })
      f.on_container(std::as_const(path), std::as_const(t));  // (jit's signature: its keys)
    for (auto& entry : t) {
      const std::string& key =
          entry.first;  // a named reference: lambdas cannot capture a structured binding in C++20
      auto& value = entry.second;
      auto find = [&](auto& other) -> auto& {
        auto it = other.find(key);
        if (it == other.end()) tree_mismatch(path, "key '" + key + "' is missing from another tree");
        return it->second;
      };
      path.push(TreePath::Kind::kKey, key);
      visit_tree(f, path, value, find(ts)...);
      path.pop();
    }
  } else if constexpr (is_tuple_like<U>::value) {
    auto one = [&]<std::size_t I>(std::integral_constant<std::size_t, I>) {
      path.push(TreePath::Kind::kIndex, std::to_string(I));
      visit_tree(f, path, std::get<I>(t), std::get<I>(ts)...);
      path.pop();
    };
    [&]<std::size_t... I>(std::index_sequence<I...>) { (one(std::integral_constant<std::size_t, I>()), ...); }
    (std::make_index_sequence<std::tuple_size_v<U>>());
  } else if constexpr (RegisteredTree<U>) {
    const auto fields = struct_fields<U>();
    static const std::vector<std::string> names = split_field_names(fields.names);
    auto tt = fields.tie(t);
    auto tts = std::make_tuple(fields.tie(ts)...);
    auto one = [&]<std::size_t I>(std::integral_constant<std::size_t, I>) {
      path.push(TreePath::Kind::kField, names[I]);
      std::apply([&](auto&... others) { visit_tree(f, path, std::get<I>(tt), std::get<I>(others)...); }, tts);
      path.pop();
    };
    [&]<std::size_t... I>(std::index_sequence<I...>) { (one(std::integral_constant<std::size_t, I>()), ...); }
    (std::make_index_sequence<std::tuple_size_v<decltype(tt)>>());
  }
  // anything else: static data, no leaves
}

template <typename F, typename T, typename... Ts>
auto map_tree(F& f, TreePath& path, const T& t, const Ts&... ts) {
  static_assert(
      ((node_kind<T>() == node_kind<Ts>()) && ...),
      "trees passed together must have the same structure (a leaf against a leaf, a vector against a "
      "vector, ...)");
  if constexpr (node_kind<T>() == 0) {
    return t;  // static data: copied
  } else if constexpr (ArrayLike<T>) {
    return f(std::as_const(path), t, ts...);
  } else if constexpr (is_std_vector<T>::value) {
    using R = decltype(map_tree(f, path, t[0], ts[0]...));
    (check_size(path, "a vector", "elements", t.size(), ts.size()), ...);
    std::vector<R> out;
    out.reserve(t.size());
    for (std::size_t i = 0; i < t.size(); ++i) {
      path.push(TreePath::Kind::kIndex, std::to_string(i));
      out.push_back(map_tree(f, path, t[i], ts[i]...));
      path.pop();
    }
    return out;
  } else if constexpr (is_string_map<T>::value) {
    using R = decltype(map_tree(f, path, t.begin()->second, ts.begin()->second...));
    (check_size(path, "a map", "keys", t.size(), ts.size()), ...);
    std::map<std::string, R> out;
    for (const auto& entry : t) {
      const std::string& key = entry.first;  // see visit_tree
      const auto& value = entry.second;
      auto find = [&](const auto& other) -> const auto& {
        auto it = other.find(key);
        if (it == other.end()) tree_mismatch(path, "key '" + key + "' is missing from another tree");
        return it->second;
      };
      path.push(TreePath::Kind::kKey, key);
      out.emplace(key, map_tree(f, path, value, find(ts)...));
      path.pop();
    }
    return out;
  } else if constexpr (is_tuple_like<T>::value) {
    auto one = [&]<std::size_t I>(std::integral_constant<std::size_t, I>) {
      path.push(TreePath::Kind::kIndex, std::to_string(I));
      auto r = map_tree(f, path, std::get<I>(t), std::get<I>(ts)...);
      path.pop();
      return r;
    };
    // Braced init evaluates left to right: the leaves are visited in order.
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      if constexpr (std::is_same_v<T, std::tuple<std::tuple_element_t<I, T>...>>)
        return std::tuple<decltype(one(std::integral_constant<std::size_t, I>()))...>{
            one(std::integral_constant<std::size_t, I>())...};
      else
        return std::pair<decltype(one(std::integral_constant<std::size_t, I>()))...>{
            one(std::integral_constant<std::size_t, I>())...};
    }
    (std::make_index_sequence<std::tuple_size_v<T>>());
  } else if constexpr (RegisteredTree<T>) {
    const auto fields = struct_fields<T>();
    static const std::vector<std::string> names = split_field_names(fields.names);
    const auto tt = fields.tie(t);
    const auto tts = std::make_tuple(fields.tie(ts)...);
    auto one = [&]<std::size_t I>(std::integral_constant<std::size_t, I>) {
      path.push(TreePath::Kind::kField, names[I]);
      auto r = std::apply(
          [&](const auto&... others) { return map_tree(f, path, std::get<I>(tt), std::get<I>(others)...); },
          tts);
      path.pop();
      using Member = std::remove_cvref_t<std::tuple_element_t<I, std::remove_cvref_t<decltype(tt)>>>;
      static_assert(std::is_same_v<decltype(r), Member>,
                    "tree_map over a SHARD_TREE struct must give each member its own type back (a struct's "
                    "members cannot change type); map a std::vector / std::map / std::tuple tree instead");
      return r;
    };
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return T{one(std::integral_constant<std::size_t, I>())...};  // aggregate init, in order
    }
    (std::make_index_sequence<std::tuple_size_v<std::remove_cvref_t<decltype(tt)>>>());
  } else {
    static_assert(node_kind<T>() == 0, "unreachable: every node kind is handled above");
    return t;
  }
}

}  // namespace detail

template <typename F, typename Tree, typename... Rest>
void tree_for_each_with_path(F&& f, Tree&& tree, Rest&&... rest) {
  TreePath path;
  detail::visit_tree(f, path, tree, rest...);
}

/// jax.tree_util.tree_map without paths: f(leaf, leaves...) for each leaf.
template <typename F, typename Tree, typename... Rest>
void tree_for_each(F&& f, Tree&& tree, Rest&&... rest) {
  tree_for_each_with_path([&](const TreePath&, auto&... leaves) { f(leaves...); }, std::forward<Tree>(tree),
                          std::forward<Rest>(rest)...);
}

/// jax.tree_util.tree_map_with_path: a tree of the same structure with f(path, leaf, leaves...)
/// at each leaf (`rest`: trees of the same structure, read at the same places). Static data is
/// copied. Containers and tuples may change their leaves' type (Tensor -> ShardedArray, float ->
/// bfloat16); a SHARD_TREE struct's members keep theirs.
template <typename F, typename Tree, typename... Rest>
auto tree_map_with_path(F&& f, const Tree& tree, const Rest&... rest) {
  TreePath path;
  return detail::map_tree(f, path, tree, rest...);
}

/// jax.tree_util.tree_map: f(leaf, leaves...) at each leaf.
template <typename F, typename Tree, typename... Rest>
auto tree_map(F&& f, const Tree& tree, const Rest&... rest) {
  return tree_map_with_path([&](const TreePath&, const auto&... leaves) { return f(leaves...); }, tree,
                            rest...);
}

/// The number of leaves (jax.tree_util.tree_structure(t).num_leaves).
template <typename Tree>
std::size_t tree_num_leaves(const Tree& tree) {
  std::size_t n = 0;
  tree_for_each([&](const auto&) { ++n; }, tree);
  return n;
}

/// The leaves' paths in visiting order, as keystr (`.layers[0].w`).
template <typename Tree>
std::vector<std::string> tree_paths(const Tree& tree) {
  std::vector<std::string> out;
  tree_for_each_with_path([&](const TreePath& p, const auto&) { out.push_back(p.to_string()); }, tree);
  return out;
}

/// jax.tree_util.tree_leaves for trees whose leaves are all of type A: the leaves in visiting
/// order, as aliases (the same memory: Tensor::alias / ShardedArray::alias). A leaf of another
/// type raises ValueError naming its path.
template <ArrayLike A, typename Tree>
std::vector<A> tree_leaves(const Tree& tree) {
  std::vector<A> out;
  tree_for_each_with_path(
      [&](const TreePath& p, const auto& leaf) {
        using L = std::remove_cvref_t<decltype(leaf)>;
        if constexpr (std::is_same_v<L, A>)
          out.push_back(leaf.alias());
        else
          raise<ValueError>("tree_leaves: the leaf at ", p.to_string(), " is a ", leaf.dtype(),
                            " array of another kind than the leaves asked for");
      },
      tree);
  return out;
}

/// Pointers to the leaves of type A in visiting order (for updates in place); other leaves
/// raise as in tree_leaves.
template <ArrayLike A, typename Tree>
std::vector<A*> tree_leaf_pointers(Tree& tree) {
  std::vector<A*> out;
  tree_for_each_with_path(
      [&](const TreePath& p, auto& leaf) {
        using L = std::remove_cvref_t<decltype(leaf)>;
        if constexpr (std::is_same_v<L, A>)
          out.push_back(&leaf);
        else
          raise<ValueError>("tree: the leaf at ", p.to_string(), " is a ", leaf.dtype(),
                            " array of another kind than the leaves asked for");
      },
      tree);
  return out;
}

/// The leaf type of a tree whose leaves are all one type (the first leaf's; void without leaves).
template <typename Tree>
using tree_leaf_t = typename decltype(detail::first_leaf<std::remove_cvref_t<Tree>>())::type;

/// Raises ValueError unless `a` and `b` have the same structure (the same containers, sizes,
/// keys and members), naming the first place they differ.
template <typename Tree>
void tree_check_same_structure(const Tree& a, const Tree& b) {
  tree_for_each([](const auto&, const auto&) {}, a, b);
}

}  // namespace shard

/// Registers an aggregate struct as a tree node: SHARD_TREE(Type, member, member, ...), every
/// data member in declaration order, at namespace scope after the struct (in its namespace).
#define SHARD_TREE(Type, ...)                                                      \
  [[maybe_unused]] inline auto shard_tree_fields(const Type*) {                    \
    return ::shard::detail::StructFields{#__VA_ARGS__, [](auto& shard_tree_obj_) { \
                                           auto& [__VA_ARGS__] = shard_tree_obj_;  \
                                           return std::tie(__VA_ARGS__);           \
                                         }};                                       \
  }
