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
/// every few seconds so forged key ids cannot make us hammer accounts. Concurrent callers share
/// one fetch: the burst of calls that arrives before the first keys are in waits for them.
public final class RemoteSigningKeys: SigningKeySource {
    private typealias Keys = [String: Ed25519PublicKey]
    private let client: Accounts_V1_AccountsClient
    private let logger: Logger
    private let minRefreshInterval: Duration
    private struct State {
        var keys: Keys = [:]
        var validUntil: ContinuousClock.Instant?
        /// When the last fetch started.
        var lastFetch: ContinuousClock.Instant?
        /// Why the last fetch failed (nil once one succeeds), for the errors of the calls that
        /// wait out the minimum interval.
        var lastError: String?
        /// The fetch under way, which every caller meanwhile awaits.
        var inFlight: Task<Keys, any Error>?
    }
    private let state = Mutex(State())

    public init(client: RPCClient, minRefreshInterval: Duration = .seconds(5), logger: Logger = Logger(label: "signing-keys")) {
        self.client = Accounts_V1_AccountsClient(client)
        self.minRefreshInterval = minRefreshInterval
        self.logger = logger
    }

    private enum Next {
        case cached(Keys)
        case await(Task<Keys, any Error>, cached: Keys)
        case fail(String)
    }

    public func keys() async throws -> [String: Ed25519PublicKey] {
        let next = state.withLock { s -> Next in
            if let until = s.validUntil, ContinuousClock.now < until { return .cached(s.keys) }
            if let t = s.inFlight { return .await(t, cached: s.keys) }
            // Tried a moment ago: keep the minimum interval while accounts is away.
            if let last = s.lastFetch, ContinuousClock.now - last < minRefreshInterval {
                if !s.keys.isEmpty { return .cached(s.keys) }
                return .fail(
                    "cannot fetch token keys from accounts: \(s.lastError ?? "no answer yet")"
                        + " (tried less than \(minRefreshInterval) ago)")
            }
            return .await(startFetch(&s), cached: s.keys)
        }
        switch next {
        case .cached(let keys): return keys
        case .fail(let message): throw RPCError(.unavailable, message)
        case .await(let fetch, let cached):
            do {
                return try await fetch.value
            } catch {
                // Keep verifying with what we have if accounts is briefly away.
                if !cached.isEmpty { return cached }
                throw RPCError(.unavailable, "cannot fetch token keys from accounts: \(error)")
            }
        }
    }

    public func refresh() async {
        let fetch = state.withLock { s -> Task<Keys, any Error>? in
            if let t = s.inFlight { return t }
            if let last = s.lastFetch, ContinuousClock.now - last < minRefreshInterval { return nil }
            return startFetch(&s)
        }
        _ = try? await fetch?.value
    }

    /// Starts a fetch (under the state's lock); it stores its outcome and leaves `inFlight`.
    private func startFetch(_ s: inout State) -> Task<Keys, any Error> {
        s.lastFetch = .now
        let t = Task { try await self.fetch() }
        s.inFlight = t
        return t
    }

    private func fetch() async throws -> Keys {
        let response: Accounts_V1_GetSigningKeysResponse
        do {
            response = try await client.getSigningKeys(Accounts_V1_GetSigningKeysRequest(), options: CallOptions(timeout: .seconds(3)))
        } catch {
            logger.warning("cannot fetch token keys from accounts: \(error)")
            state.withLock { s in
                s.lastError = "\(error)"
                s.inFlight = nil
            }
            throw error
        }
        var keys: Keys = [:]
        for k in response.keys where k.algorithm == .ed25519 {
            if let key = try? Ed25519PublicKey(rawRepresentation: k.publicKey) { keys[k.keyId] = key }
        }
        let cacheFor: Duration = response.hasCacheFor && response.cacheFor.seconds > 0 ? .seconds(response.cacheFor.seconds) : .seconds(300)
        state.withLock { s in
            s.keys = keys
            s.validUntil = .now + cacheFor
            s.lastError = nil
            s.inFlight = nil
        }
        logger.debug("fetched \(keys.count) token keys")
        return keys
    }
}
