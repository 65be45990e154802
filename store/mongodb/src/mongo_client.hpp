#pragma once
// A thin C++ layer over libmongoc for the MongoDB store: documents built and
// read without copies, one client per Store (a Store is used by one thread),
// and every driver or server error mapped onto ErrorKind in one place.
#include <bson/bson.h>
#include <mongoc/mongoc.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/status.hpp"

namespace sagapool::mongo {

// Appends to a bson_t it does not own (a document or a sub-document being
// built).
class Builder {
 public:
  explicit Builder(bson_t* b) : b_(b) {}
  Builder& str(std::string_view key, std::string_view v);
  Builder& i64(std::string_view key, std::int64_t v);
  Builder& boolean(std::string_view key, bool v);
  Builder& null(std::string_view key);
  Builder& doc(std::string_view key, const bson_t* v);
  // A sub-document or array filled by `fill`.
  Builder& sub(std::string_view key, const std::function<void(Builder&)>& fill);
  Builder& array(std::string_view key, const std::function<void(Builder&)>& fill);
  // Array elements: keys "0", "1", ... in order.
  Builder& push_str(std::string_view v);
  Builder& push_i64(std::int64_t v);
  Builder& push_doc(const std::function<void(Builder&)>& fill);
  bson_t* get() const { return b_; }

 private:
  std::string next_index();
  bson_t* b_;
  std::uint32_t index_ = 0;
};

// An owned document.
class Doc : public Builder {
 public:
  Doc() : Builder(&b_) { bson_init(&b_); }
  ~Doc() { bson_destroy(&b_); }
  Doc(const Doc&) = delete;
  Doc& operator=(const Doc&) = delete;
  const bson_t* bson() const { return &b_; }
  bson_t* bson() { return &b_; }

 private:
  bson_t b_;
};

// Reads fields of a document it does not own. Missing fields read as empty,
// 0 or false (the store writes every field it reads back).
class View {
 public:
  explicit View(const bson_t* b) : b_(b) {}
  bool has(const char* key) const;
  std::string_view str(const char* key) const;
  std::int64_t i64(const char* key) const;  // int32, int64 or double
  bool boolean(const char* key) const;
  // A sub-document's fields, in order: fn(key, value as int64).
  void each_i64(const char* key, const std::function<void(std::string_view, std::int64_t)>& fn) const;
  const bson_t* get() const { return b_; }

 private:
  bool find(const char* key, bson_iter_t& it) const;
  const bson_t* b_;
};

// The result of a bulk write: which operations failed, by input index.
struct WriteError {
  std::size_t index = 0;
  int code = 0;
  std::string message;
};
inline constexpr int kDuplicateKey = 11000;

struct BulkResult {
  std::int64_t matched = 0;
  std::int64_t inserted = 0;
  std::vector<WriteError> errors;
};

// One connection (mongoc_client_t) and its database.
class Client {
 public:
  // `url` is a mongodb:// URI naming a database.
  static Status open(const std::string& url, std::unique_ptr<Client>& out);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& display_name() const { return display_; }

  // A command on this database; `reply` receives the server's answer.
  Status command(const bson_t* cmd, Doc& reply, std::string_view what);
  // The server's clock (hello's localTime), ms since the epoch.
  Status server_now(std::int64_t& out);
  Status find(const char* collection, const bson_t* filter, const bson_t* opts,
              const std::function<void(const View&)>& fn, std::string_view what);
  // Runs `ops` (inserts and updates added through the Bulk) as one bulk
  // write. Write errors are returned in `out`, not as a failed Status; only
  // errors of the call itself (network, write concern, ...) are.
  class Bulk;
  Status bulk(const char* collection, bool ordered, const std::function<void(Bulk&)>& ops,
              BulkResult& out, std::string_view what);
  Status update_many(const char* collection, const bson_t* filter, const bson_t* update,
                     std::int64_t* matched, std::string_view what);
  Status delete_many(const char* collection, const bson_t* filter, std::string_view what);
  // Whether `collection` has an index named `name` (false for a missing
  // collection).
  Status index_exists(const char* collection, const char* name, bool& out);
  Status distinct(const char* collection, const char* key, const bson_t* filter,
                  std::vector<std::string>& out, std::string_view what);

  // Driver or server error -> Status (network and step-downs: retry_call).
  Status map_error(const bson_error_t& e, std::string_view what) const;

  // Whether documents are looked up one `{_id: id}` at a time rather than
  // by a list: true on FerretDB (its buildInfo says so), where only that
  // filter is answered from an index and `$in` parses every document of
  // the collection (docs/mongodb.md). Asked once, on first use.
  Status lookups_one_by_one(bool& out);

 private:
  Client() = default;
  mongoc_collection_t* collection(const char* name);

  mongoc_client_t* client_ = nullptr;
  mongoc_database_t* db_ = nullptr;
  std::vector<std::pair<std::string, mongoc_collection_t*>> collections_;
  std::string db_name_;
  std::string display_;
  std::optional<bool> one_by_one_;
};

// The operations of one bulk write, added straight into the driver's bulk
// operations of at most 10 updates and deletes, or 1,000 inserts, each
// (Client::bulk sends them in order). FerretDB 1.24 holds one of its 100
// SQLite connections per update statement until the command ends; when the
// commands of all clients together hold them all it stops answering anyone
// (one command of 100 statements is enough).
class Client::Bulk {
 public:
  void insert(const bson_t* doc);
  void update_one(const bson_t* filter, const bson_t* update, bool upsert = false);
  void delete_one(const bson_t* filter);

 private:
  friend class Client;
  struct Piece {
    mongoc_bulk_operation_t* op;
    std::size_t from;  // the index of its first operation in the whole bulk
    std::size_t size;
    bool inserts;
  };
  Bulk(mongoc_collection_t* collection, const bson_t* opts) : collection_(collection), opts_(opts) {}
  ~Bulk();
  Bulk(const Bulk&) = delete;
  Bulk& operator=(const Bulk&) = delete;
  mongoc_bulk_operation_t* piece_for(bool insert);

  mongoc_collection_t* collection_;
  const bson_t* opts_;
  std::vector<Piece> pieces_;
  std::size_t n_ = 0;
  bool failed_ = false;
  bson_error_t error_{};
};

}  // namespace sagapool::mongo
