import RPCCore
import Storage

/// Receiving accounts' account-deletion event (`<Service>Internal/EraseUser`), which every service
/// but accounts implements the same way: both fields checked, the erasure applied once per event
/// id in one transaction, `replayed` answered for a redelivery. A service writes only `erase`.
public enum EraseUser {
    /// Validates `eventID` and `userID` (INVALID_ARGUMENT naming them), then runs `erase(tx, userID)`
    /// in one write transaction the first time `eventID` is seen (needs `Migration.inbox`).
    /// Returns true when it was a redelivery (nothing done).
    public static func receive(
        eventID: String, userID: String, store: ServiceStore,
        _ erase: @escaping @Sendable (Transaction, String) throws -> Void
    ) async throws -> Bool {
        var errors = FieldErrors()
        FieldRules.eventID(eventID, into: &errors)
        let user = FieldRules.id(userID, field: "user_id", into: &errors)
        try errors.throwIfAny()
        let replayed = try await store.receiveOnce(eventID: eventID) { tx in try erase(tx, user) }
        store.logger.notice(replayed ? "erase-user event replayed" : "user erased", metadata: ["event": "\(eventID)", "user": "\(user)"])
        return replayed
    }
}
