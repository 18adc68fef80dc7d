import Contracts
import Logging
import RPCCore
import ServiceKit
import Storage

/// Delivers accounts' outbox (the account-deletion `EraseUser` calls) with the kit's RPC senders:
/// what `ServiceHost.run(outbox:)` does in the process, packaged for tests and tools that run
/// delivery themselves with their own clients. A service that is down (or does not exist yet)
/// answers UNAVAILABLE: its events wait with their own backoff, in order, visible in the log and
/// in `sqlite3 <data-dir>/accounts.sqlite 'select * from outbox where delivered_at is null'`.
public struct UserDeletionDeliverer: Sendable {
    let delivery: OutboxDelivery

    /// `client(destination)` returns a client for that service carrying the service credential.
    public init(
        core: AccountsCore, retry: OutboxRetryPolicy = OutboxRetryPolicy(), pollInterval: Duration = .seconds(5),
        client: @escaping @Sendable (String) -> RPCClient
    ) {
        delivery = OutboxDelivery(
            database: core.database, retry: retry, pollInterval: pollInterval, logger: core.logger,
            deliver: core.outboxSenders(peers: PeerClients(make: client)).deliver)
    }

    public func run() async { await delivery.run() }

    /// One pass now (tests).
    @discardableResult
    public func deliverDue() async throws -> OutboxDelivery.Pass { try await delivery.deliverDue() }
}
