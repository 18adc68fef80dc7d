import Contracts
import Logging
import RPCCore
import Security
import Synchronization

/// Where a verifier gets accounts' public token keys.
public protocol SigningKeySource: Sendable {
    /// Current keys by key id.
    func keys() async throws -> [String: Ed25519PublicKey]
    /// Called when a token names an unknown key id: fetch again (rate-limited by the source).
    func refresh() async
}

/// Fixed keys (accounts itself, tests).
public struct StaticSigningKeys: SigningKeySource {
    let value: @Sendable () -> [String: Ed25519PublicKey]
    public init(_ value: @escaping @Sendable () -> [String: Ed25519PublicKey]) { self.value = value }
    public func keys() async throws -> [String: Ed25519PublicKey] { value() }
    public func refresh() async {}
}

/// Keys fetched from `accounts.v1.Accounts/GetSigningKeys`, cached for the time accounts says and
/// fetched again early when a token names a key id we do not know (key rotation), at most once
/// every few seconds so forged key ids cannot make us hammer accounts.
public final class RemoteSigningKeys: SigningKeySource {
    private let client: Accounts_V1_AccountsClient
    private let logger: Logger
    private let minRefreshInterval: Duration
    private struct State {
        var keys: [String: Ed25519PublicKey] = [:]
        var validUntil: ContinuousClock.Instant?
        var lastFetch: ContinuousClock.Instant?
        /// Why the last fetch failed (nil once one succeeds), for the errors of the calls that
        /// wait out the minimum interval.
        var lastError: String?
    }
    private let state = Mutex(State())

    public init(client: RPCClient, minRefreshInterval: Duration = .seconds(5), logger: Logger = Logger(label: "signing-keys")) {
        self.client = Accounts_V1_AccountsClient(client)
        self.minRefreshInterval = minRefreshInterval
        self.logger = logger
    }

    public func keys() async throws -> [String: Ed25519PublicKey] {
        let (cached, fresh, recent, lastError) = state.withLock { s in
            (s.keys, s.validUntil.map { ContinuousClock.now < $0 } ?? false,
             s.lastFetch.map { ContinuousClock.now - $0 < minRefreshInterval } ?? false, s.lastError)
        }
        if fresh { return cached }
        // Fetched (or tried) a moment ago: keep the minimum interval while accounts is away.
        if recent {
            if !cached.isEmpty { return cached }
            throw RPCError(.unavailable, "cannot fetch token keys from accounts: \(lastError ?? "a fetch is under way")"
                           + " (tried less than \(minRefreshInterval) ago)")
        }
        do {
            return try await fetch()
        } catch {
            // Keep verifying with what we have if accounts is briefly away.
            if !cached.isEmpty { return cached }
            throw RPCError(.unavailable, "cannot fetch token keys from accounts: \(error)")
        }
    }

    public func refresh() async {
        let due = state.withLock { s in s.lastFetch.map { ContinuousClock.now - $0 >= minRefreshInterval } ?? true }
        guard due else { return }
        do { _ = try await fetch() } catch { logger.warning("cannot refresh token keys from accounts: \(error)") }
    }

    private func fetch() async throws -> [String: Ed25519PublicKey] {
        state.withLock { $0.lastFetch = .now }
        let response: Accounts_V1_GetSigningKeysResponse
        do {
            response = try await client.getSigningKeys(Accounts_V1_GetSigningKeysRequest(), options: CallOptions(timeout: .seconds(3)))
        } catch {
            state.withLock { $0.lastError = "\(error)" }
            throw error
        }
        var keys: [String: Ed25519PublicKey] = [:]
        for k in response.keys where k.algorithm == .ed25519 {
            if let key = try? Ed25519PublicKey(rawRepresentation: k.publicKey) { keys[k.keyId] = key }
        }
        let cacheFor: Duration = response.hasCacheFor && response.cacheFor.seconds > 0 ? .seconds(response.cacheFor.seconds) : .seconds(300)
        state.withLock { s in
            s.keys = keys
            s.validUntil = .now + cacheFor
            s.lastError = nil
        }
        logger.debug("fetched \(keys.count) token keys")
        return keys
    }
}
