import Contracts
import Logging
import RPCCore
import Storage
import Synchronization

/// Delivers account-deletion events from the outbox: one `accounts.v1.UserDeleted` per erasing
/// service, each sent as `EraseUser(event_id, user_id)` to that service's Internal API until it
/// answers OK. A service that is down (or does not exist yet) answers UNAVAILABLE: its events wait
/// with backoff (Storage's `OutboxDelivery`), visible to an operator in the log and in
/// `sqlite3 <data-dir>/accounts.sqlite 'select * from outbox where delivered_at is null'`.
public struct UserDeletionDeliverer: Sendable {
    let delivery: OutboxDelivery

    /// `client(destination)` returns a client for that service carrying the service credential
    /// (`ServiceHost.peerClient` in the executable, a loopback channel in tests).
    public init(core: AccountsCore, retry: OutboxRetryPolicy = OutboxRetryPolicy(), pollInterval: Duration = .seconds(5),
                client: @escaping @Sendable (String) -> RPCClient) {
        let logger = core.logger
        // One client (one connection) per destination, made on first use.
        let clients = ClientCache(make: client)
        delivery = OutboxDelivery(database: core.database, retry: retry, pollInterval: pollInterval, logger: logger) { event in
            try await Self.deliver(event, client: clients.client(event.destination))
        }
    }

    public func run() async { await delivery.run() }

    /// One pass now (tests).
    @discardableResult
    public func deliverDue() async throws -> OutboxDelivery.Pass { try await delivery.deliverDue() }

    static func deliver(_ event: OutboxEvent, client: RPCClient) async throws {
        guard event.kind == AccountsService.userDeletedKind else {
            throw RPCError(.internal, "accounts does not know how to deliver outbox events of kind \(event.kind)")
        }
        let deleted = try Accounts_V1_UserDeleted(serializedBytes: event.payload)
        let options = CallOptions(timeout: .seconds(10))
        switch event.destination {
        case "social":
            var r = Social_V1_EraseUserRequest()
            (r.eventId, r.userId) = (deleted.eventId, deleted.userId)
            _ = try await Social_V1_SocialInternalClient(client).eraseUser(r, options: options)
        case "finance":
            var r = Finance_V1_EraseUserRequest()
            (r.eventId, r.userId) = (deleted.eventId, deleted.userId)
            _ = try await Finance_V1_FinanceInternalClient(client).eraseUser(r, options: options)
        case "tasks":
            var r = Tasks_V1_EraseUserRequest()
            (r.eventId, r.userId) = (deleted.eventId, deleted.userId)
            _ = try await Tasks_V1_TasksInternalClient(client).eraseUser(r, options: options)
        case "matchmaking":
            var r = Matchmaking_V1_EraseUserRequest()
            (r.eventId, r.userId) = (deleted.eventId, deleted.userId)
            _ = try await Matchmaking_V1_MatchmakingInternalClient(client).eraseUser(r, options: options)
        default:
            throw RPCError(.internal, "no erasing service named \(event.destination)")
        }
    }
}

/// Clients made once per destination.
final class ClientCache: Sendable {
    private let make: @Sendable (String) -> RPCClient
    private let clients = Mutex<[String: RPCClient]>([:])

    init(make: @escaping @Sendable (String) -> RPCClient) { self.make = make }

    func client(_ destination: String) -> RPCClient {
        clients.withLock { c in
            if let existing = c[destination] { return existing }
            let new = make(destination)
            c[destination] = new
            return new
        }
    }
}
