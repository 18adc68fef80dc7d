import RPCCore
import Storage

/// Receiving accounts' account-deletion event (`<Service>Internal/EraseUser`), which every service
/// but accounts implements the same way: both fields checked, the erasure applied once per event
/// id in one transaction, `replayed` answered for a redelivery, and the user recorded as erased
/// (`ErasedUsers`: their access tokens are refused here from then on). A service writes only
/// `erase`.
public enum EraseUser {
    /// Validates `eventID` and `userID` (INVALID_ARGUMENT naming them), then runs `erase(tx, userID)`
    /// in one write transaction the first time `eventID` is seen (needs `Migration.inbox` and
    /// `Migration.erasedUsers`), and in the same transaction deletes the user's stored idempotency
    /// answers and records the user in `kit_erased_users`.
    /// Returns true when it was a redelivery (nothing done).
    public static func receive(
        eventID: String, userID: String, store: ServiceStore,
        _ erase: @escaping @Sendable (Transaction, String) throws -> Void
    ) async throws -> Bool {
        var errors = FieldErrors()
        FieldRules.eventID(eventID, into: &errors)
        let user = FieldRules.id(userID, field: "user_id", into: &errors)
        try errors.throwIfAny()
        let now = SystemClock.nowMilliseconds()
        // Refused from memory before the erasure commits, not after: accounts sends this only for
        // an account it deleted, so no call of the user's should start from here on.
        try ErasedUsers.of(store.database).insert(user, at: now)
        let replayed = try await store.receiveOnce(eventID: eventID) { tx in
            try erase(tx, user)
            try forgetStoredAnswers(tx, of: user)
            try tx.execute("INSERT OR IGNORE INTO kit_erased_users (user_id, erased_at) VALUES (?, ?)", user, now)
        }
        store.logger.notice(replayed ? "erase-user event replayed" : "user erased", metadata: ["event": "\(eventID)", "user": "\(user)"])
        return replayed
    }

    /// The user's stored answers to retried requests go with them (they hold what the user sent:
    /// names, invitees' emails). Every service scopes its keys with the caller's id last
    /// (`<Method>:<user id>`, `finance:<user id>`); matched exactly, not with LIKE (ids may hold
    /// `_`, which LIKE would take for any character).
    static func forgetStoredAnswers(_ tx: Transaction, of user: String) throws {
        guard try tx.tableExists("idempotency_keys") else { return }
        try tx.execute("DELETE FROM idempotency_keys WHERE substr(scope, -length(?1) - 1) = ':' || ?1", user)
    }
}
