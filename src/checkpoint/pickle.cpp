#include "fsdp/checkpoint/pickle.h"

#include <cstring>
#include <limits>

namespace fsdp::checkpoint::pickle {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kGlobal: return "global";
    case Kind::kObject: return "object";
    case Kind::kPersistent: return "persistent id";
  }
  return "?";
}

int64_t Value::as_int(const std::string& what) const {
  if (kind != Kind::kInt) throw PickleError(detail::cat(what, " is a ", kind_name(kind), ", not an int"));
  return i;
}

const std::string& Value::as_str(const std::string& what) const {
  if (kind != Kind::kStr) throw PickleError(detail::cat(what, " is a ", kind_name(kind), ", not a str"));
  return s;
}

const Value* Value::get(const std::string& key) const {
  const Value* d = kind == Kind::kObject ? state : this;
  if (d == nullptr || d->kind != Kind::kDict) return nullptr;
  for (size_t k = 0; k + 1 < d->items.size(); k += 2) {
    if (d->items[k]->kind == Kind::kStr && d->items[k]->s == key) return d->items[k + 1];
  }
  return nullptr;
}

std::string Value::global_name() const {
  if (kind == Kind::kGlobal) return s + "." + name;
  if (kind == Kind::kObject && cls != nullptr) return cls->global_name();
  return kind_name(kind);
}

Value* Pickled::make(Kind kind) {
  arena_.emplace_back();
  arena_.back().kind = kind;
  return &arena_.back();
}

namespace {

// The opcodes of protocols 2-5 this reader accepts (pickletools' names).
enum Op : uint8_t {
  kMark = '(', kStop = '.', kPop = '0', kPopMark = '1', kDup = '2', kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M',
  kNone = 'N', kBinPersId = 'Q', kReduce = 'R', kBinUnicode = 'X', kAppend = 'a', kBuild = 'b', kGlobal = 'c',
  kDict = 'd', kEmptyDict = '}', kAppends = 'e', kBinGet = 'h', kLongBinGet = 'j', kList = 'l', kEmptyList = ']',
  kBinPut = 'q', kLongBinPut = 'r', kSetItem = 's', kTuple = 't', kEmptyTuple = ')', kSetItems = 'u',
  kBinFloat = 'G', kProto = 0x80, kNewObj = 0x81, kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87,
  kNewTrue = 0x88, kNewFalse = 0x89, kLong1 = 0x8a, kLong4 = 0x8b, kBinBytes = 'B', kShortBinBytes = 'C',
  kShortBinUnicode = 0x8c, kBinUnicode8 = 0x8d, kBinBytes8 = 0x8e, kEmptySet = 0x8f, kAddItems = 0x90,
  kFrozenSet = 0x91, kNewObjEx = 0x92, kStackGlobal = 0x93, kMemoize = 0x94, kFrame = 0x95, kByteArray8 = 0x96,
  kNextBuffer = 0x97, kReadonlyBuffer = 0x98,
};

class Reader {
 public:
  Reader(const std::string& bytes, const AllowList& allowed, const std::string& origin)
      : in_(bytes), allowed_(allowed), origin_(origin) {}

  Pickled run() {
    while (true) {
      const size_t at = pos_;
      const uint8_t op = u8();
      if (op == kStop) break;
      step(op, at);
    }
    if (stack_.size() != 1 || !marks_.empty()) fail(pos_ - 1, "STOP with ", stack_.size(), " values on the stack");
    if (pos_ != in_.size()) fail(pos_, in_.size() - pos_, " bytes after STOP");
    out_.root = stack_.back();
    return std::move(out_);
  }

 private:
  template <class... A>
  [[noreturn]] void fail(size_t at, const A&... why) const {
    throw PickleError(detail::cat(origin_, ": pickle at byte ", at, ": ", why...));
  }

  const uint8_t* take(size_t n) {
    if (n > in_.size() - pos_) fail(pos_, "truncated: needs ", n, " more bytes, ", in_.size() - pos_, " left");
    const auto* p = reinterpret_cast<const uint8_t*>(in_.data()) + pos_;
    pos_ += n;
    return p;
  }
  uint8_t u8() { return *take(1); }
  uint64_t le(size_t n) {
    const uint8_t* p = take(n);
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
    return v;
  }
  std::string text(size_t n) {
    const uint8_t* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  // Up to "\n", for GLOBAL's module and name.
  std::string line() {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string::npos || end - pos_ > 256) fail(pos_, "GLOBAL without a newline-terminated name");
    std::string s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  size_t length(uint64_t n) {
    if (n > in_.size() - pos_) fail(pos_, "a length of ", n, " bytes, ", in_.size() - pos_, " left in the file");
    return static_cast<size_t>(n);
  }

  Value* make(Kind k) {
    if (++values_ > 8 * in_.size() + 16) fail(pos_, "too many values");  // each opcode makes at most a few
    return out_.make(k);
  }
  void push(const Value* v) { stack_.push_back(v); }
  const Value* pop(size_t at) {
    if (stack_.size() <= floor()) fail(at, "pops an empty stack");
    const Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  const Value* top(size_t at) {
    if (stack_.size() <= floor()) fail(at, "reads an empty stack");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // The values since the last MARK, which is removed.
  std::vector<const Value*> pop_mark(size_t at) {
    if (marks_.empty()) fail(at, "no MARK to pop to");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<const Value*> out(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return out;
  }
  Value* mutable_top(size_t at, Kind want, const char* op) {
    const Value* v = top(at);
    if (v->kind != want) fail(at, op, " on a ", kind_name(v->kind), ", not a ", kind_name(want));
    return const_cast<Value*>(v);  // the arena owns every value; containers fill in place
  }
  const Value* tuple(std::vector<const Value*> items) {
    Value* t = make(Kind::kTuple);
    t->items = std::move(items);
    return t;
  }
  void memo_put(uint64_t idx, size_t at) {
    // Each memo entry costs an opcode of at least one byte, and Python numbers
    // them from 0: a pickle of n bytes never needs an index of n or more. The
    // limit grows with the file, so no valid checkpoint exceeds it (a 70B model's
    // .metadata at 64 ranks holds ~2.3M entries), and the memo stays within 8
    // bytes per byte of input.
    if (idx >= in_.size()) fail(at, "memo index ", idx, " beyond what a pickle of ", in_.size(), " bytes can number");
    if (memo_.size() <= idx) memo_.resize(static_cast<size_t>(idx) + 1, nullptr);
    memo_[static_cast<size_t>(idx)] = top(at);
  }
  const Value* memo_get(uint64_t idx, size_t at) {
    if (idx >= memo_.size() || memo_[static_cast<size_t>(idx)] == nullptr) fail(at, "memo entry ", idx, " is not set");
    return memo_[static_cast<size_t>(idx)];
  }
  const Value* global(const std::string& module, const std::string& name, size_t at) {
    if (allowed_.count({module, name}) == 0) {
      fail(at, "refers to ", module, ".", name, ", which is not one of the classes a PyTorch distributed checkpoint "
           "holds (a foreign class: this reader creates no other, and runs nothing)");
    }
    Value* g = make(Kind::kGlobal);
    g->s = module;
    g->name = name;
    return g;
  }
  void nest(size_t at) {
    if (marks_.size() >= static_cast<size_t>(kMaxDepth)) fail(at, "nests deeper than ", kMaxDepth, " levels");
  }
  int64_t signed_long(const uint8_t* p, size_t n, size_t at) {
    if (n > 8) fail(at, "an integer of ", n, " bytes (more than 64 bits)");
    if (n == 0) return 0;
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
    if (n < 8 && (p[n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    int64_t out;
    std::memcpy(&out, &v, sizeof(out));
    return out;
  }

  void step(uint8_t op, size_t at) {
    switch (op) {
      case kProto: {
        const uint8_t p = u8();
        if (p < 2 || p > 5) fail(at, "protocol ", int(p), " (this reader reads 2 to 5)");
        break;
      }
      case kFrame: le(8); break;  // a hint for buffered readers
      case kMark: nest(at); marks_.push_back(stack_.size()); break;
      case kPop: pop(at); break;
      case kPopMark: pop_mark(at); break;
      case kDup: push(top(at)); break;
      case kNone: push(make(Kind::kNone)); break;
      case kNewTrue:
      case kNewFalse: {
        Value* v = make(Kind::kBool);
        v->b = op == kNewTrue;
        push(v);
        break;
      }
      case kBinInt:
      case kBinInt1:
      case kBinInt2: {
        Value* v = make(Kind::kInt);
        if (op == kBinInt) {
          v->i = static_cast<int32_t>(static_cast<uint32_t>(le(4)));
        } else {
          v->i = static_cast<int64_t>(le(op == kBinInt1 ? 1 : 2));
        }
        push(v);
        break;
      }
      case kLong1:
      case kLong4: {
        const size_t n = length(op == kLong1 ? le(1) : le(4));
        Value* v = make(Kind::kInt);
        v->i = signed_long(take(n), n, at);
        push(v);
        break;
      }
      case kBinFloat: {
        uint64_t bits = 0;
        const uint8_t* p = take(8);
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | p[k];  // big-endian
        Value* v = make(Kind::kFloat);
        std::memcpy(&v->f, &bits, sizeof(double));
        push(v);
        break;
      }
      case kShortBinUnicode:
      case kBinUnicode:
      case kBinUnicode8:
      case kShortBinBytes:
      case kBinBytes:
      case kBinBytes8:
      case kByteArray8: {
        const bool unicode = op == kShortBinUnicode || op == kBinUnicode || op == kBinUnicode8;
        const size_t width = op == kShortBinUnicode || op == kShortBinBytes ? 1
                             : op == kBinUnicode || op == kBinBytes       ? 4
                                                                          : 8;
        Value* v = make(unicode ? Kind::kStr : Kind::kBytes);
        v->s = text(length(le(width)));
        push(v);
        break;
      }
      case kEmptyTuple: push(tuple({})); break;
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        const size_t n = op == kTuple1 ? 1 : op == kTuple2 ? 2 : 3;
        std::vector<const Value*> items(n);
        for (size_t k = n; k-- > 0;) items[k] = pop(at);
        push(tuple(std::move(items)));
        break;
      }
      case kTuple: push(tuple(pop_mark(at))); break;
      case kEmptyList: push(make(Kind::kList)); break;
      case kList: {
        Value* l = make(Kind::kList);
        l->items = pop_mark(at);
        push(l);
        break;
      }
      case kAppend: {
        const Value* v = pop(at);
        mutable_top(at, Kind::kList, "APPEND")->items.push_back(v);
        break;
      }
      case kAppends: {
        std::vector<const Value*> vs = pop_mark(at);
        Value* l = mutable_top(at, Kind::kList, "APPENDS");
        l->items.insert(l->items.end(), vs.begin(), vs.end());
        break;
      }
      case kEmptyDict: push(make(Kind::kDict)); break;
      case kDict:
      case kSetItems: {
        std::vector<const Value*> kv = pop_mark(at);
        if (kv.size() % 2 != 0) fail(at, "a dict of ", kv.size(), " items (keys and values must pair)");
        Value* d = op == kDict ? make(Kind::kDict) : mutable_top(at, Kind::kDict, "SETITEMS");
        d->items.insert(d->items.end(), kv.begin(), kv.end());
        if (op == kDict) push(d);
        break;
      }
      case kSetItem: {
        const Value* v = pop(at);
        const Value* k = pop(at);
        Value* d = mutable_top(at, Kind::kDict, "SETITEM");
        d->items.push_back(k);
        d->items.push_back(v);
        break;
      }
      case kEmptySet:
      case kFrozenSet:
      case kAddItems: fail(at, "a set (DCP's files hold none)");
      case kGlobal: {
        const std::string module = line();
        const std::string name = line();
        push(global(module, name, at));
        break;
      }
      case kStackGlobal: {
        const Value* name = pop(at);
        const Value* module = pop(at);
        if (module->kind != Kind::kStr || name->kind != Kind::kStr) fail(at, "STACK_GLOBAL of a non-str name");
        push(global(module->s, name->s, at));
        break;
      }
      case kReduce:
      case kNewObj: {
        const Value* args = pop(at);
        const Value* cls = pop(at);
        if (cls->kind != Kind::kGlobal) fail(at, op == kReduce ? "REDUCE" : "NEWOBJ", " of a ", kind_name(cls->kind));
        if (args->kind != Kind::kTuple) fail(at, "arguments of ", cls->global_name(), " are a ", kind_name(args->kind));
        Value* o = make(Kind::kObject);
        o->cls = cls;
        o->items = args->items;
        o->newobj = op == kNewObj;
        push(o);
        break;
      }
      case kNewObjEx: fail(at, "NEWOBJ_EX (keyword arguments; DCP's files have none)");
      case kBuild: {
        const Value* state = pop(at);
        Value* o = mutable_top(at, Kind::kObject, "BUILD");
        if (o->state != nullptr) fail(at, "a second BUILD of one ", o->global_name());
        o->state = state;
        break;
      }
      case kBinPersId: {
        Value* p = make(Kind::kPersistent);
        p->items.push_back(pop(at));
        push(p);
        break;
      }
      case kBinPut: memo_put(le(1), at); break;
      case kLongBinPut: memo_put(le(4), at); break;
      case kMemoize: memo_put(memo_.size(), at); break;
      case kBinGet: push(memo_get(le(1), at)); break;
      case kLongBinGet: push(memo_get(le(4), at)); break;
      case kNextBuffer:
      case kReadonlyBuffer: fail(at, "an out-of-band buffer (protocol 5 NEXT_BUFFER; none is supplied)");
      default:
        fail(at, "opcode 0x", "0123456789abcdef"[op >> 4], "0123456789abcdef"[op & 15],
             " is not one this reader accepts (protocols 2-5 without text opcodes, sets or out-of-band buffers)");
    }
  }

  const std::string& in_;
  const AllowList& allowed_;
  const std::string& origin_;
  size_t pos_ = 0;
  size_t values_ = 0;
  std::vector<const Value*> stack_;
  std::vector<size_t> marks_;
  std::vector<const Value*> memo_;
  Pickled out_;
};

class Writer {
 public:
  explicit Writer(int protocol) : protocol_(protocol) {
    FSDP_ASSERT(protocol == 2 || protocol == 4, "pickle::write: protocol ", protocol, " (2 or 4)");
  }
  std::string finish(const Value& v) {
    out_.push_back(static_cast<char>(kProto));
    out_.push_back(static_cast<char>(protocol_));
    put(v, 0);
    out_.push_back(static_cast<char>(kStop));
    return std::move(out_);
  }

 private:
  void op(uint8_t o) { out_.push_back(static_cast<char>(o)); }
  void le(uint64_t v, int n) {
    for (int k = 0; k < n; ++k) out_.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
  }
  void sized(uint8_t short_op, uint8_t op4, uint8_t op8, const std::string& s) {
    if (s.size() < 256 && short_op != 0) {
      op(short_op);
      le(s.size(), 1);
    } else if (s.size() <= 0xffffffffu) {
      op(op4);
      le(s.size(), 4);
    } else {
      FSDP_CHECK(protocol_ >= 4, "pickle::write: a string of ", s.size(), " bytes needs protocol 4");
      op(op8);
      le(s.size(), 8);
    }
    out_ += s;
  }
  void put(const Value& v, int depth) {
    FSDP_CHECK(depth < kMaxDepth, "pickle::write: values nest deeper than ", kMaxDepth, " levels");
    switch (v.kind) {
      case Kind::kNone: op(kNone); break;
      case Kind::kBool: op(v.b ? kNewTrue : kNewFalse); break;
      case Kind::kInt:
        if (v.i >= 0 && v.i < 256) {
          op(kBinInt1);
          le(static_cast<uint64_t>(v.i), 1);
        } else if (v.i >= 0 && v.i < 65536) {
          op(kBinInt2);
          le(static_cast<uint64_t>(v.i), 2);
        } else if (v.i >= std::numeric_limits<int32_t>::min() && v.i <= std::numeric_limits<int32_t>::max()) {
          op(kBinInt);
          le(static_cast<uint32_t>(static_cast<int32_t>(v.i)), 4);
        } else {
          op(kLong1);
          le(8, 1);
          le(static_cast<uint64_t>(v.i), 8);
        }
        break;
      case Kind::kFloat: {
        uint64_t bits;
        std::memcpy(&bits, &v.f, sizeof(bits));
        op(kBinFloat);
        for (int k = 7; k >= 0; --k) out_.push_back(static_cast<char>((bits >> (8 * k)) & 0xff));
        break;
      }
      case Kind::kStr: sized(protocol_ >= 4 ? kShortBinUnicode : 0, kBinUnicode, kBinUnicode8, v.s); break;
      case Kind::kBytes: sized(kShortBinBytes, kBinBytes, kBinBytes8, v.s); break;
      case Kind::kTuple:
        if (v.items.empty()) {
          op(kEmptyTuple);
        } else if (v.items.size() <= 3) {
          for (const Value* x : v.items) put(*x, depth + 1);
          op(static_cast<uint8_t>(kTuple1 + v.items.size() - 1));
        } else {
          op(kMark);
          for (const Value* x : v.items) put(*x, depth + 1);
          op(kTuple);
        }
        break;
      case Kind::kList:
        op(kEmptyList);
        if (!v.items.empty()) {
          op(kMark);
          for (const Value* x : v.items) put(*x, depth + 1);
          op(kAppends);
        }
        break;
      case Kind::kDict:
        op(kEmptyDict);
        if (!v.items.empty()) {
          op(kMark);
          for (const Value* x : v.items) put(*x, depth + 1);
          op(kSetItems);
        }
        break;
      case Kind::kGlobal:
        op(kGlobal);
        out_ += v.s + "\n" + v.name + "\n";
        break;
      case Kind::kObject: {
        FSDP_ASSERT(v.cls != nullptr && v.cls->kind == Kind::kGlobal, "pickle::write: an object without its class");
        put(*v.cls, depth + 1);
        Value args;
        args.kind = Kind::kTuple;
        args.items = v.items;
        put(args, depth + 1);
        op(v.newobj ? kNewObj : kReduce);
        if (v.state != nullptr) {
          put(*v.state, depth + 1);
          op(kBuild);
        }
        break;
      }
      case Kind::kPersistent:
        FSDP_ASSERT(v.items.size() == 1, "pickle::write: a persistent id of ", v.items.size(), " values");
        put(*v.items[0], depth + 1);
        op(kBinPersId);
        break;
    }
  }

  int protocol_;
  std::string out_;
};

}  // namespace

Pickled read(const std::string& bytes, const AllowList& allowed, const std::string& origin) {
  return Reader(bytes, allowed, origin).run();
}

std::string write(const Value& v, int protocol) { return Writer(protocol).finish(v); }

const Value* Builder::none() { return arena_.make(Kind::kNone); }
const Value* Builder::boolean(bool v) {
  Value* x = arena_.make(Kind::kBool);
  x->b = v;
  return x;
}
const Value* Builder::integer(int64_t v) {
  Value* x = arena_.make(Kind::kInt);
  x->i = v;
  return x;
}
const Value* Builder::real(double v) {
  Value* x = arena_.make(Kind::kFloat);
  x->f = v;
  return x;
}
const Value* Builder::str(std::string v) {
  Value* x = arena_.make(Kind::kStr);
  x->s = std::move(v);
  return x;
}
const Value* Builder::bytes(std::string v) {
  Value* x = arena_.make(Kind::kBytes);
  x->s = std::move(v);
  return x;
}
const Value* Builder::tuple(std::vector<const Value*> items) {
  Value* x = arena_.make(Kind::kTuple);
  x->items = std::move(items);
  return x;
}
const Value* Builder::list(std::vector<const Value*> items) {
  Value* x = arena_.make(Kind::kList);
  x->items = std::move(items);
  return x;
}
const Value* Builder::dict(std::vector<const Value*> items) {
  FSDP_ASSERT(items.size() % 2 == 0, "pickle::Builder::dict: ", items.size(), " items");
  Value* x = arena_.make(Kind::kDict);
  x->items = std::move(items);
  return x;
}
const Value* Builder::global(const std::string& module, const std::string& name) {
  Value* x = arena_.make(Kind::kGlobal);
  x->s = module;
  x->name = name;
  return x;
}
const Value* Builder::object(const Value* cls, const Value* args, const Value* state, bool newobj) {
  FSDP_ASSERT(cls->kind == Kind::kGlobal && args->kind == Kind::kTuple, "pickle::Builder::object: bad class or args");
  Value* x = arena_.make(Kind::kObject);
  x->cls = cls;
  x->items = args->items;
  x->state = state;
  x->newobj = newobj;
  return x;
}
const Value* Builder::persistent(const Value* id) {
  Value* x = arena_.make(Kind::kPersistent);
  x->items.push_back(id);
  return x;
}

}  // namespace fsdp::checkpoint::pickle
