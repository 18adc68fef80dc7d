import Accounts
import Contracts
import Foundation
import Observability
import RPCCore
import RPCTransport
import Security
import ServiceKit
import Synchronization
import Testing

/// Issue 11's hostile clients against accounts: concurrent guesses (defect 1) and floods of
/// sign-ups (defect 3). Real gRPC on loopback, real scrypt costs where the race needs them.
@Suite struct HostileClientTests {
    /// The outcome of many concurrent calls, by status.
    final class Tally: Sendable {
        private let codes = Mutex<[StatusCode: Int]>([:])
        private let retryHints = Mutex<[Int64]>([])
        func add(_ code: StatusCode, retry: Int64? = nil) {
            codes.withLock { $0[code, default: 0] += 1 }
            if let retry { retryHints.withLock { $0.append(retry) } }
        }
        subscript(_ code: StatusCode) -> Int { codes.withLock { $0[code] ?? 0 } }
        var hints: [Int64] { retryHints.withLock { $0 } }
        var summary: String { codes.withLock { "\($0.map { "\($0.key.name)=\($0.value)" }.sorted())" } }
    }

    static func run(_ tally: Tally, _ body: @Sendable () async throws -> Void) async {
        do {
            try await body()
            tally.add(.ok)
        } catch let e as RPCError {
            tally.add(e.code, retry: e.failure.retryDelaySeconds)
        } catch {
            tally.add(.unknown)
        }
    }

    /// 40 concurrent log-ins with a wrong password for one account: at most 5 (the limit) are
    /// evaluated; the rest are refused before scrypt with RESOURCE_EXHAUSTED and RetryInfo.
    @Test func concurrentWrongPasswordsAreThrottledBeforeTheyAreChecked() async throws {
        try await withAccounts({ c in
            c.passwordParameters = PasswordHasher.Parameters(n: 1 << 14, r: 8, p: 1)  // ~25 ms: a wide race
        }) { env in
            let name = uniqueName()
            try await env.signUp(name)
            let tally = Tally()
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<40 {
                    group.addTask { await Self.run(tally) { _ = try await env.logIn(name, "wrong password \(UUID())") } }
                }
            }
            #expect(tally[.unauthenticated] <= 5, "\(tally.summary)")
            #expect(tally[.unauthenticated] + tally[.resourceExhausted] == 40, "\(tally.summary)")
            #expect(tally.hints.count == tally[.resourceExhausted] && tally.hints.allSatisfy { $0 > 0 }, "RetryInfo on every refusal")
            // The right password is refused too now: the account is locked for the window.
            await expectFailure(.resourceExhausted) { try await env.logIn(name) }
        }
    }

    /// The same race through ChangePassword and DeleteAccount (the current password is a secret
    /// to guess too), sharing the account's limit with LogIn.
    @Test func concurrentWrongCurrentPasswordsShareTheLimit() async throws {
        try await withAccounts({ c in
            c.passwordParameters = PasswordHasher.Parameters(n: 1 << 14, r: 8, p: 1)
        }) { env in
            let signed = try await env.signUp()
            let tally = Tally()
            await withTaskGroup(of: Void.self) { group in
                for i in 0..<30 {
                    group.addTask {
                        await Self.run(tally) {
                            if i % 2 == 0 {
                                var r = Accounts_V1_ChangePasswordRequest()
                                r.currentPassword = "wrong \(i)"
                                r.newPassword = "a new long password"
                                _ = try await env.accounts.changePassword(r, options: bearer(signed.session))
                            } else {
                                var r = Accounts_V1_DeleteAccountRequest()
                                r.password = "wrong \(i)"
                                _ = try await env.accounts.deleteAccount(r, options: bearer(signed.session))
                            }
                        }
                    }
                }
            }
            #expect(tally[.invalidArgument] <= 5, "\(tally.summary)")  // "is not the current password"
            #expect(tally[.invalidArgument] + tally[.resourceExhausted] == 30, "\(tally.summary)")
        }
    }

    /// Unknown accounts from one address: the address's limit (20) holds under concurrency too.
    @Test func concurrentGuessesFromOneAddressStopAtTheAddressLimit() async throws {
        try await withAccounts({ c in
            c.passwordParameters = PasswordHasher.Parameters(n: 1 << 14, r: 8, p: 1)
        }) { env in
            let tally = Tally()
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<60 { group.addTask { await Self.run(tally) { _ = try await env.logIn(uniqueName(), "guess") } } }
            }
            #expect(tally[.unauthenticated] <= 20, "\(tally.summary)")
            #expect(tally[.unauthenticated] + tally[.resourceExhausted] == 60, "\(tally.summary)")
        }
    }

    /// A burst of sign-ups from one address (at the production scrypt cost) does not hold up
    /// another user's log-in: sign-ups past the address's limit are refused before scrypt, the
    /// hashing queue is bounded (the rest are shed with UNAVAILABLE and a retry hint), so the
    /// log-in is answered within seconds instead of after the whole burst.
    @Test func aSignUpFloodNeitherQueuesWithoutBoundNorDelaysLogIns() async throws {
        try await withAccounts({ c in
            c.passwordParameters = .default  // ~50 ms per hash: 300 queued would be ~7 s of work
            c.maxQueuedHashes = 8
        }) { env in
            let name = uniqueName()
            try await env.signUp(name)
            let tally = Tally()
            let flood = Task {
                await withTaskGroup(of: Void.self) { group in
                    for _ in 0..<300 {
                        group.addTask {
                            await Self.run(tally) {
                                _ = try await env.accounts.signUp(signUpRequest(uniqueName()), options: CallOptions(timeout: .seconds(60)))
                            }
                        }
                    }
                }
            }
            try await Task.sleep(for: .milliseconds(100))
            // The well-behaved user: a short deadline, and the usual retry on a shed call.
            var loggedIn = false
            for _ in 0..<20 where !loggedIn {
                do {
                    _ = try await env.accounts.logIn(
                        logInRequest(username: name, password: "correct horse battery staple"),
                        options: CallOptions(timeout: .seconds(3)))
                    loggedIn = true
                } catch let e as RPCError where e.code == .unavailable {
                    try await Task.sleep(for: .milliseconds(200))
                }
            }
            #expect(loggedIn, "the log-in waited behind the flood")
            await flood.value
            // Made: at most the address's limit. Shed (UNAVAILABLE, not counted against the
            // address: they did not happen) or refused by the limit: the rest, each at once.
            #expect(tally[.ok] <= 100, "the address limit: \(tally.summary)")
            #expect(tally[.unavailable] > 0, "the bounded queue shed load: \(tally.summary)")
            #expect(tally[.ok] + tally[.resourceExhausted] + tally[.unavailable] == 300, "\(tally.summary)")
            #expect(tally.hints.count == tally[.resourceExhausted] + tally[.unavailable], "a retry hint on every refusal")
            print("sign-up flood of 300: \(tally.summary)")
        }
    }

    /// Sign-ups and guest accounts are limited per client address, with RetryInfo.
    @Test func signUpsAndGuestsAreLimitedPerAddress() async throws {
        try await withAccounts({ c in
            c.maxSignUpsPerAddress = 3
            c.maxGuestsPerAddress = 2
        }) { env in
            func rejections(_ limit: String) -> Double {
                ProcessMetrics.sample("throttle_rejections_total", labels: [("limit", limit)], in: ProcessMetrics.exposition()) ?? 0
            }
            let before = (signUps: rejections("sign_ups_per_address"), guests: rejections("guests_per_address"))
            for _ in 0..<3 { try await env.signUp() }
            let refused = await expectFailure(.resourceExhausted) { try await env.signUp() }
            #expect((refused?.retryDelaySeconds ?? 0) > 0)
            #expect(rejections("sign_ups_per_address") == before.signUps + 1, "the refusal is counted under its limit's name")
            // A sign-up refused for another reason (a taken name) does not use up the allowance.
            for _ in 0..<2 { _ = try await env.accounts.createGuest(Accounts_V1_CreateGuestRequest()) }
            await expectFailure(.resourceExhausted) { try await env.accounts.createGuest(Accounts_V1_CreateGuestRequest()) }
            #expect(rejections("guests_per_address") == before.guests + 1)
            // Through the gateway, each client address has its own allowance.
            let viaGateway = Accounts_V1_AccountsClient(
                RPCClient(transport: CredentialedTransport(base: env.channel, gatewayToken: testGatewayToken)))
            _ = try await viaGateway.signUp(
                signUpRequest(uniqueName()), options: CallOptions(metadata: Metadata([("x-forwarded-for", "192.0.2.44")])))
        }
    }

    /// The sign-up and guest limits are kept in storage: a restart does not give an address a new
    /// allowance (it used to: the counts were in memory only).
    @Test func signUpLimitsSurviveARestart() async throws {
        let limits: (inout AccountsConfiguration) -> Void = { c in
            c.maxSignUpsPerAddress = 2
            c.maxGuestsPerAddress = 1
        }
        let first = try await TestAccounts.start(limits)
        do {
            for _ in 0..<2 { _ = try await first.accounts.signUp(signUpRequest(uniqueName())) }
            _ = try await first.accounts.createGuest(Accounts_V1_CreateGuestRequest())
        } catch {
            await first.stop()
            throw error
        }
        await first.stop(keepingData: true)
        let again = try await TestAccounts.start(directory: first.directory, limits)
        do {
            let refused = await expectFailure(.resourceExhausted) { _ = try await again.accounts.signUp(signUpRequest(uniqueName())) }
            #expect((refused?.retryDelaySeconds ?? 0) > 3000, "the hour's window runs from the first sign-up: \(refused?.retryDelaySeconds ?? 0)")
            await expectFailure(.resourceExhausted) { _ = try await again.accounts.createGuest(Accounts_V1_CreateGuestRequest()) }
            // Another address has its own allowance.
            let viaGateway = Accounts_V1_AccountsClient(
                RPCClient(transport: CredentialedTransport(base: again.channel, gatewayToken: testGatewayToken)))
            _ = try await viaGateway.signUp(
                signUpRequest(uniqueName()), options: CallOptions(metadata: Metadata([("x-forwarded-for", "192.0.2.45")])))
        } catch {
            await again.stop()
            throw error
        }
        await again.stop()
    }

    /// A guest nobody can use any more (its last refresh token expired) is deleted like any
    /// account: tombstoned, and erased in every other service through the outbox.
    @Test func unusedGuestsExpire() async throws {
        try await withAccounts({ c in c.refreshTokenLifetime = .seconds(2) }) { env in
            let guest = try await env.accounts.createGuest(Accounts_V1_CreateGuestRequest())
            let active = try await env.accounts.createGuest(Accounts_V1_CreateGuestRequest())
            #expect(try await env.core.expireUnusedGuests() == 0, "both still have a live refresh token")
            // The second guest uses its session meanwhile: a fresh refresh token keeps it.
            try await Task.sleep(for: .milliseconds(1000))
            var refresh = Accounts_V1_RefreshSessionRequest()
            refresh.refreshToken = active.session.refreshToken
            _ = try await env.accounts.refreshSession(refresh)
            try await Task.sleep(for: .milliseconds(1200))
            #expect(try await env.core.expireUnusedGuests() == 1)
            let row = try #require(
                try env.core.database.readSync { c in
                    try c.queryOne("SELECT deleted_at, username FROM users WHERE id = ?", guest.user.userId)
                })
            #expect(row["deleted_at"] != .null && row["username"] == .null)
            let events = try await env.core.database.pendingOutbox().filter {
                (try? Accounts_V1_UserDeleted(serializedBytes: $0.payload).userId) == guest.user.userId
            }
            #expect(Set(events.map(\.destination)) == ["social", "finance", "tasks", "matchmaking"])
        }
    }
}
