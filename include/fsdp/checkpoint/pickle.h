// A restricted reader and a writer of Python pickles, for the files of
// PyTorch's distributed checkpoint (DCP, checkpoint/dcp.h): its .metadata (a
// pickle of DCP's dataclasses, protocol 4 from Python 3.11) and the data.pkl
// of each torch.save archive (protocol 2). No Python runs.
//
// Note [Restricted pickle]. A pickle is a program for a stack machine that
// may import any module and call anything; Python's own loader must never see
// an untrusted one, and neither does this reader execute one. It reads
// protocols 2 to 5 into inert values (None, bool, int, float, str, bytes,
// tuple, list, dict, and three that stand for what Python would have built):
//   kGlobal      a class or function named by GLOBAL / STACK_GLOBAL: only the
//                (module, name) pairs of the caller's allow-list; anything
//                else is refused as a foreign class, naming it and the file;
//   kObject      REDUCE or NEWOBJ of an allowed global with its arguments, and
//                the state a BUILD gave it: recorded, never called;
//   kPersistent  BINPERSID's id (torch.save's storage references).
// Limits: the input's size (the caller reads a bounded file), 64 nested
// containers, memo indices below the input's size in bytes (each entry costs
// an opcode; a limit that grows with the file, never one a valid large
// checkpoint exceeds), 8-byte integers (LONG1/LONG4 longer
// than that are refused), no out-of-band buffers (protocol 5's NEXT_BUFFER)
// and no text opcodes of protocols 0 and 1. Values live in an arena owned by
// the Pickled result, so a pickle that makes a list contain itself (memo +
// APPEND) builds a cycle that costs nothing to free; walks over values are
// bounded by depth (kMaxDepth), so a cycle is an error, never a hang.
//
// The writer emits protocol 2 or 4 from the same values, as Python's pickle
// module writes them closely enough for pickle.load and torch.load
// (weights_only) to accept: globals as GLOBAL, objects as REDUCE or NEWOBJ
// followed by BUILD when they carry state, no memo.
#pragma once

#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/common/error.h"

namespace fsdp::checkpoint::pickle {

// A pickle that cannot be read, or a value of another shape than expected:
// the message names the file.
class PickleError : public Failure {
 public:
  using Failure::Failure;
};

inline constexpr int kMaxDepth = 64;  // nested containers (read and walked)

enum class Kind { kNone, kBool, kInt, kFloat, kStr, kBytes, kTuple, kList, kDict, kGlobal, kObject, kPersistent };
// "None", "bool", ..., "persistent id": for messages.
const char* kind_name(Kind k);

struct Value {
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                    // kStr (UTF-8), kBytes; kGlobal: the module
  std::string name;                 // kGlobal: the name in the module
  std::vector<const Value*> items;  // kTuple, kList; kDict: key, value, key, value, ...; kObject: its args;
                                    // kPersistent: the id (one item)
  const Value* cls = nullptr;       // kObject: the global it was made from
  const Value* state = nullptr;     // kObject: what BUILD gave it (null: none)
  bool newobj = false;              // kObject: made by NEWOBJ (cls.__new__(cls, *args)), else REDUCE

  // Typed access; PickleError naming `what` and the kind found otherwise.
  int64_t as_int(const std::string& what) const;
  const std::string& as_str(const std::string& what) const;
  // kDict: the value of string key `key`, or null; kObject: the same in its state (a dict).
  const Value* get(const std::string& key) const;
  // kGlobal: "module.name"; kObject: its global's.
  std::string global_name() const;
};

// What pickle::read returns: the value and the arena that owns it and every value it reaches.
class Pickled {
 public:
  const Value* root = nullptr;
  // A new value owned by this arena.
  Value* make(Kind kind);

 private:
  std::deque<Value> arena_;
};

// (module, name) pairs GLOBAL and STACK_GLOBAL may name.
using AllowList = std::set<std::pair<std::string, std::string>>;

// Reads one pickle (up to its STOP; trailing bytes are refused). `origin`
// names the file in errors. Throws PickleError.
Pickled read(const std::string& bytes, const AllowList& allowed, const std::string& origin);

// Builds values for write(); owns them.
class Builder {
 public:
  const Value* none();
  const Value* boolean(bool v);
  const Value* integer(int64_t v);
  const Value* real(double v);
  const Value* str(std::string v);
  const Value* bytes(std::string v);
  const Value* tuple(std::vector<const Value*> items);
  const Value* list(std::vector<const Value*> items);
  // Keys and values alternate: {k0, v0, k1, v1, ...}.
  const Value* dict(std::vector<const Value*> items);
  const Value* global(const std::string& module, const std::string& name);
  // REDUCE (newobj false) or NEWOBJ of `cls` (a global) with `args` (a tuple), then BUILD with `state` unless null.
  const Value* object(const Value* cls, const Value* args, const Value* state = nullptr, bool newobj = false);
  const Value* persistent(const Value* id);

 private:
  Pickled arena_;
};

// The pickle of `v` in `protocol` (2 or 4).
std::string write(const Value& v, int protocol);

}  // namespace fsdp::checkpoint::pickle
