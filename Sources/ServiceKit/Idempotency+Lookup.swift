import RPCCore
import Storage

extension SQLReader {
    /// The answer stored for an earlier request with `key` (`Transaction.idempotent`), read before
    /// a handler's slow part: a retry is answered from here without calling a peer again (it may
    /// be down), and a key reused for another request fails before anything else. Nil when the key
    /// is new; FAILED_PRECONDITION naming `field` when it was used for a different request. The
    /// write still goes through `idempotent`, which decides again inside its transaction (a
    /// concurrent first request may have stored the key since).
    public func storedAnswer<Response: ProtoMessage>(
        scope: String, key: String, fingerprint: [UInt8], field: String = "idempotency_key",
        as _: Response.Type = Response.self
    ) throws -> Response? {
        guard let row = try queryOne("SELECT request_hash, response FROM idempotency_keys WHERE scope = ? AND key = ?", scope, key)
        else { return nil }
        guard try row.get("request_hash", as: [UInt8].self) == fingerprint else {
            throw FieldErrors.single(
                .failedPrecondition, field: field,
                "was used for a different request: choose a new key for a new operation")
        }
        do {
            return try Response(serializedBytes: try row.get("response", as: [UInt8].self))
        } catch {
            throw RPCError(.internal, "internal error", cause: error)
        }
    }
}
