#include "mongo_client.hpp"

#include <algorithm>
#include <mutex>

namespace sagapool::mongo {

namespace {

struct UriFree {
  void operator()(mongoc_uri_t* u) const noexcept { mongoc_uri_destroy(u); }
};
struct CursorFree {
  void operator()(mongoc_cursor_t* c) const noexcept { mongoc_cursor_destroy(c); }
};

// Documents a find asks for in its first reply (the server still caps the
// reply at 16 MB).
constexpr std::int64_t kFirstBatch = 1'000'000;

// Server errors that a later attempt can get past: the network, elections,
// shutdowns, write-concern and lock timeouts, write conflicts.
bool transient_server_code(std::uint32_t code) {
  static constexpr std::uint32_t kCodes[] = {6,    7,     50,    64,    89,    91,    112,   189,
                                             262,  9001,  10107, 11600, 11602, 13435, 13436, 24,
                                             46,   63,    150,   234,   251,   10058, 13388};
  return std::find(std::begin(kCodes), std::end(kCodes), code) != std::end(kCodes);
}

// mongodb://[user@]host[:port][,...]/database: the URL without its password
// or options, for messages and logs.
std::string display_of(const mongoc_uri_t* uri, const char* database) {
  std::string out = "mongodb://";
  if (const char* user = mongoc_uri_get_username(uri); user != nullptr && user[0] != '\0') {
    out += user;
    out += '@';
  }
  bool first = true;
  for (const mongoc_host_list_t* h = mongoc_uri_get_hosts(uri); h != nullptr; h = h->next) {
    if (!first) out += ',';
    first = false;
    out += h->host_and_port;
  }
  out += '/';
  out += database;
  return out;
}

}  // namespace

// ---- Builder / View ---------------------------------------------------------

Builder& Builder::str(std::string_view key, std::string_view v) {
  bson_append_utf8(b_, key.data(), static_cast<int>(key.size()), v.data(), static_cast<int>(v.size()));
  return *this;
}
Builder& Builder::i64(std::string_view key, std::int64_t v) {
  bson_append_int64(b_, key.data(), static_cast<int>(key.size()), v);
  return *this;
}
Builder& Builder::boolean(std::string_view key, bool v) {
  bson_append_bool(b_, key.data(), static_cast<int>(key.size()), v);
  return *this;
}
Builder& Builder::null(std::string_view key) {
  bson_append_null(b_, key.data(), static_cast<int>(key.size()));
  return *this;
}
Builder& Builder::doc(std::string_view key, const bson_t* v) {
  bson_append_document(b_, key.data(), static_cast<int>(key.size()), v);
  return *this;
}
Builder& Builder::sub(std::string_view key, const std::function<void(Builder&)>& fill) {
  bson_t child;
  bson_append_document_begin(b_, key.data(), static_cast<int>(key.size()), &child);
  Builder b(&child);
  fill(b);
  bson_append_document_end(b_, &child);
  return *this;
}
Builder& Builder::array(std::string_view key, const std::function<void(Builder&)>& fill) {
  bson_t child;
  bson_append_array_begin(b_, key.data(), static_cast<int>(key.size()), &child);
  Builder b(&child);
  fill(b);
  bson_append_array_end(b_, &child);
  return *this;
}
std::string Builder::next_index() { return std::to_string(index_++); }
Builder& Builder::push_str(std::string_view v) { return str(next_index(), v); }
Builder& Builder::push_i64(std::int64_t v) { return i64(next_index(), v); }
Builder& Builder::push_doc(const std::function<void(Builder&)>& fill) { return sub(next_index(), fill); }

bool View::find(const char* key, bson_iter_t& it) const {
  return bson_iter_init_find(&it, b_, key);
}
bool View::has(const char* key) const {
  bson_iter_t it;
  return find(key, it) && !BSON_ITER_HOLDS_NULL(&it);
}
std::string_view View::str(const char* key) const {
  bson_iter_t it;
  if (!find(key, it) || !BSON_ITER_HOLDS_UTF8(&it)) return {};
  std::uint32_t len = 0;
  const char* s = bson_iter_utf8(&it, &len);
  return {s, len};
}
std::int64_t View::i64(const char* key) const {
  bson_iter_t it;
  if (!find(key, it)) return 0;
  if (BSON_ITER_HOLDS_INT64(&it)) return bson_iter_int64(&it);
  if (BSON_ITER_HOLDS_INT32(&it)) return bson_iter_int32(&it);
  if (BSON_ITER_HOLDS_DOUBLE(&it)) return static_cast<std::int64_t>(bson_iter_double(&it));
  if (BSON_ITER_HOLDS_DATE_TIME(&it)) return bson_iter_date_time(&it);
  return 0;
}
bool View::boolean(const char* key) const {
  bson_iter_t it;
  return find(key, it) && BSON_ITER_HOLDS_BOOL(&it) && bson_iter_bool(&it);
}
void View::each_i64(const char* key, const std::function<void(std::string_view, std::int64_t)>& fn) const {
  bson_iter_t it;
  bson_iter_t child;
  if (!find(key, it) || !BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &child)) return;
  while (bson_iter_next(&child)) {
    const std::string_view k(bson_iter_key(&child), bson_iter_key_len(&child));
    fn(k, BSON_ITER_HOLDS_INT64(&child)   ? bson_iter_int64(&child)
          : BSON_ITER_HOLDS_INT32(&child) ? bson_iter_int32(&child)
                                          : 0);
  }
}

// ---- Client -----------------------------------------------------------------

Status Client::open(const std::string& url, std::unique_ptr<Client>& out) {
  static std::once_flag init;
  std::call_once(init, [] {
    mongoc_init();
    // The driver's own warnings (FerretDB answers "no such command" to the
    // endSessions a client sends when it closes) are not ours to print;
    // errors reach the caller as Status.
    mongoc_log_set_handler([](mongoc_log_level_t, const char*, const char*, void*) {}, nullptr);
  });
  bson_error_t err;
  std::unique_ptr<mongoc_uri_t, UriFree> uri(mongoc_uri_new_with_error(url.c_str(), &err));
  // The parser's message names the rule broken, never the URL's text.
  if (!uri) return Status::fatal(std::string("store URL is not a valid mongodb:// URI: ") + err.message);
  const char* database = mongoc_uri_get_database(uri.get());
  if (database == nullptr || database[0] == '\0') {
    return Status::fatal("store URL " + display_of(uri.get(), "") +
                         " names no database (mongodb://HOST[:PORT]/DATABASE)");
  }
  std::unique_ptr<Client> c(new Client());
  c->db_name_ = database;
  c->display_ = display_of(uri.get(), database);
  c->client_ = mongoc_client_new_from_uri_with_error(uri.get(), &err);
  if (c->client_ == nullptr) return Status::fatal(c->display_ + ": " + err.message);
  mongoc_client_set_error_api(c->client_, MONGOC_ERROR_API_VERSION_2);
  mongoc_client_set_appname(c->client_, "sagapool");
  c->db_ = mongoc_client_get_database(c->client_, database);
  out = std::move(c);
  return Status::ok();
}

Client::~Client() {
  for (auto& [name, coll] : collections_) mongoc_collection_destroy(coll);
  if (db_ != nullptr) mongoc_database_destroy(db_);
  if (client_ != nullptr) mongoc_client_destroy(client_);
}

mongoc_collection_t* Client::collection(const char* name) {
  for (auto& [n, c] : collections_) {
    if (n == name) return c;
  }
  mongoc_collection_t* c = mongoc_client_get_collection(client_, db_name_.c_str(), name);
  collections_.emplace_back(name, c);
  return c;
}

Status Client::map_error(const bson_error_t& e, std::string_view what) const {
  std::string message = display_ + ": " + std::string(what) + ": " + e.message;
  switch (e.domain) {
    case MONGOC_ERROR_STREAM:
    case MONGOC_ERROR_SERVER_SELECTION:
    case MONGOC_ERROR_WRITE_CONCERN:
      return Status::retry_call(std::move(message));
    case MONGOC_ERROR_SERVER:
      message += " (code " + std::to_string(e.code) + ")";
      if (transient_server_code(e.code)) return Status::retry_call(std::move(message));
      return Status::fatal(std::move(message));
    default:
      return Status::fatal(std::move(message));
  }
}

Status Client::command(const bson_t* cmd, Doc& reply, std::string_view what) {
  bson_error_t err;
  bson_destroy(reply.bson());
  if (!mongoc_database_command_with_opts(db_, cmd, nullptr, nullptr, reply.bson(), &err)) {
    return map_error(err, what);
  }
  return Status::ok();
}

Status Client::server_now(std::int64_t& out) {
  Doc cmd;
  cmd.i64("hello", 1);
  Doc reply;
  if (Status s = command(cmd.bson(), reply, "reading the server's clock"); !s) return s;
  bson_iter_t it;
  if (!bson_iter_init_find(&it, reply.bson(), "localTime") || !BSON_ITER_HOLDS_DATE_TIME(&it)) {
    return Status::fatal(display_ + ": the server's hello reply has no localTime");
  }
  out = bson_iter_date_time(&it);
  return Status::ok();
}

Status Client::lookups_one_by_one(bool& out) {
  if (!one_by_one_) {
    Doc cmd;
    cmd.i64("buildInfo", 1);
    Doc reply;
    if (Status s = command(cmd.bson(), reply, "asking which server this is"); !s) return s;
    one_by_one_ = View(reply.bson()).has("ferretdbVersion");
  }
  out = *one_by_one_;
  return Status::ok();
}

Status Client::find(const char* name, const bson_t* filter, const bson_t* opts,
                    const std::function<void(const View&)>& fn, std::string_view what) {
  // Everything in the first reply, and no "limit" (callers stop taking
  // documents instead): FerretDB 1.24 keeps one of its 100 SQLite
  // connections for every cursor it did not read to the end, and stops
  // serving anyone when they are all taken.
  Doc all;
  if (opts != nullptr) bson_concat(all.bson(), opts);
  if (opts == nullptr || !bson_has_field(opts, "batchSize")) all.i64("batchSize", kFirstBatch);
  std::unique_ptr<mongoc_cursor_t, CursorFree> cursor(
      mongoc_collection_find_with_opts(collection(name), filter, all.bson(), nullptr));
  const bson_t* doc = nullptr;
  while (mongoc_cursor_next(cursor.get(), &doc)) fn(View(doc));
  bson_error_t err;
  if (mongoc_cursor_error(cursor.get(), &err)) return map_error(err, what);
  return Status::ok();
}

namespace {
constexpr std::size_t kInsertsPerCommand = 1000;
constexpr std::size_t kChangesPerCommand = 10;
}  // namespace

Client::Bulk::~Bulk() {
  for (Piece& p : pieces_) mongoc_bulk_operation_destroy(p.op);
}

mongoc_bulk_operation_t* Client::Bulk::piece_for(bool insert) {
  const std::size_t limit = insert ? kInsertsPerCommand : kChangesPerCommand;
  if (pieces_.empty() || pieces_.back().inserts != insert || pieces_.back().size == limit) {
    pieces_.push_back({mongoc_collection_create_bulk_operation_with_opts(collection_, opts_), n_, 0, insert});
  }
  ++pieces_.back().size;
  ++n_;
  return pieces_.back().op;
}

void Client::Bulk::insert(const bson_t* doc) {
  if (!failed_ && !mongoc_bulk_operation_insert_with_opts(piece_for(true), doc, nullptr, &error_)) failed_ = true;
}
void Client::Bulk::update_one(const bson_t* filter, const bson_t* update, bool upsert) {
  bson_t opts = BSON_INITIALIZER;
  if (upsert) BSON_APPEND_BOOL(&opts, "upsert", true);
  if (!failed_ && !mongoc_bulk_operation_update_one_with_opts(piece_for(false), filter, update, &opts, &error_)) {
    failed_ = true;
  }
  bson_destroy(&opts);
}
void Client::Bulk::delete_one(const bson_t* filter) {
  if (!failed_ && !mongoc_bulk_operation_remove_one_with_opts(piece_for(false), filter, nullptr, &error_)) {
    failed_ = true;
  }
}

Status Client::bulk(const char* name, bool ordered, const std::function<void(Bulk&)>& ops, BulkResult& out,
                    std::string_view what) {
  out = {};
  Doc opts;
  opts.boolean("ordered", ordered);
  Bulk all(collection(name), opts.bson());
  ops(all);
  if (all.failed_) return Status::fatal(display_ + ": " + std::string(what) + ": " + all.error_.message);
  for (const Bulk::Piece& piece : all.pieces_) {
    Doc reply;
    bson_destroy(reply.bson());
    bson_error_t err;
    const bool ok = mongoc_bulk_operation_execute(piece.op, reply.bson(), &err) != 0;
    const View r(reply.bson());
    out.matched += r.i64("nMatched");
    out.inserted += r.i64("nInserted");
    const std::size_t errors_before = out.errors.size();
    bson_iter_t it;
    bson_iter_t errors;
    if (bson_iter_init_find(&it, reply.bson(), "writeErrors") && BSON_ITER_HOLDS_ARRAY(&it) &&
        bson_iter_recurse(&it, &errors)) {
      while (bson_iter_next(&errors)) {
        bson_t e;
        std::uint32_t len = 0;
        const std::uint8_t* data = nullptr;
        bson_iter_document(&errors, &len, &data);
        if (data == nullptr || !bson_init_static(&e, data, len)) continue;
        const View ev(&e);
        out.errors.push_back({piece.from + static_cast<std::size_t>(ev.i64("index")),
                              static_cast<int>(ev.i64("code")), std::string(ev.str("errmsg"))});
      }
    }
    if (!ok && out.errors.size() == errors_before) return map_error(err, what);
    if (bson_iter_init_find(&it, reply.bson(), "writeConcernErrors") && BSON_ITER_HOLDS_ARRAY(&it)) {
      bson_iter_t wc;
      if (bson_iter_recurse(&it, &wc) && bson_iter_next(&wc)) {
        return Status::retry_call(display_ + ": " + std::string(what) + ": write concern not satisfied");
      }
    }
    if (ordered && out.errors.size() > errors_before) break;
  }
  return Status::ok();
}

Status Client::update_many(const char* name, const bson_t* filter, const bson_t* update,
                           std::int64_t* matched, std::string_view what) {
  Doc reply;
  bson_destroy(reply.bson());
  bson_error_t err;
  if (!mongoc_collection_update_many(collection(name), filter, update, nullptr, reply.bson(), &err)) {
    return map_error(err, what);
  }
  if (matched != nullptr) *matched = View(reply.bson()).i64("matchedCount");
  return Status::ok();
}

Status Client::delete_many(const char* name, const bson_t* filter, std::string_view what) {
  Doc reply;
  bson_destroy(reply.bson());
  bson_error_t err;
  if (!mongoc_collection_delete_many(collection(name), filter, nullptr, reply.bson(), &err)) {
    return map_error(err, what);
  }
  return Status::ok();
}

Status Client::index_exists(const char* name, const char* index, bool& out) {
  out = false;
  std::unique_ptr<mongoc_cursor_t, CursorFree> cursor(
      mongoc_collection_find_indexes_with_opts(collection(name), nullptr));
  const bson_t* doc = nullptr;
  while (mongoc_cursor_next(cursor.get(), &doc)) {
    if (View(doc).str("name") == index) out = true;
  }
  bson_error_t err;
  if (mongoc_cursor_error(cursor.get(), &err)) {
    if (err.domain == MONGOC_ERROR_SERVER && err.code == 26) return Status::ok();  // NamespaceNotFound
    return map_error(err, "listing indexes");
  }
  return Status::ok();
}

Status Client::distinct(const char* name, const char* key, const bson_t* filter,
                        std::vector<std::string>& out, std::string_view what) {
  out.clear();
  Doc cmd;
  cmd.str("distinct", name).str("key", key).doc("query", filter);
  Doc reply;
  if (Status s = command(cmd.bson(), reply, what); !s) return s;
  bson_iter_t it;
  bson_iter_t values;
  if (bson_iter_init_find(&it, reply.bson(), "values") && BSON_ITER_HOLDS_ARRAY(&it) &&
      bson_iter_recurse(&it, &values)) {
    while (bson_iter_next(&values)) {
      if (!BSON_ITER_HOLDS_UTF8(&values)) continue;
      std::uint32_t len = 0;
      const char* s = bson_iter_utf8(&values, &len);
      out.emplace_back(s, len);
    }
  }
  return Status::ok();
}

}  // namespace sagapool::mongo
