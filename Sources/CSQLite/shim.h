#ifndef CSQLITE_SHIM_H
#define CSQLITE_SHIM_H
/* SQLite 3 (Debian: libsqlite3-dev). */
#include <sqlite3.h>

/* SQLITE_TRANSIENT is a cast macro Swift cannot import: SQLite copies the bytes before returning,
   so Swift's temporary buffers may be released right after the call. */
static inline int csqlite_bind_text(sqlite3_stmt *stmt, int index, const char *text, int length) {
    return sqlite3_bind_text(stmt, index, text, length, SQLITE_TRANSIENT);
}
/* A NULL pointer would bind SQL NULL, so an empty blob is bound as a zero-length zeroblob. */
static inline int csqlite_bind_blob(sqlite3_stmt *stmt, int index, const void *bytes, int length) {
    if (length == 0) return sqlite3_bind_zeroblob(stmt, index, 0);
    return sqlite3_bind_blob(stmt, index, bytes, length, SQLITE_TRANSIENT);
}

/* Group commit: with synchronous=NORMAL a WAL commit is written but not fsynced; syncing the WAL
   file once after a batch of commits, before acknowledging them, gives FULL's durability for the
   whole batch at the cost of one fsync. The WAL's sqlite3_file comes from the connection itself,
   so SQLite's own VFS does the sync. No WAL open yet means nothing to sync. */
static inline int csqlite_sync_wal(sqlite3 *db) {
    sqlite3_file *wal = 0;
    int rc = sqlite3_file_control(db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &wal);
    if (rc != SQLITE_OK) return rc;
    if (wal == 0 || wal->pMethods == 0) return SQLITE_OK;
    return wal->pMethods->xSync(wal, SQLITE_SYNC_NORMAL);
}
#endif
