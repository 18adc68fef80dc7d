import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Social
import Testing

/// The contract: a live stream ends with UNAUTHENTICATED when its access token's session is
/// revoked — not only when the token expires.
@Suite("Social: streams of revoked sessions end", .serialized)
struct SessionRevocationTests {
    @Test func loggingOutEndsThatSessionsStreamsOnly() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            // A second session of alice (a second phone): log in again.
            var login = Accounts_V1_LogInRequest()
            login.username = alice.username
            login.password = "correct horse battery staple"
            let second = try await env.accounts.logIn(login).session.accessToken
            var aliceTwo = alice
            aliceTwo.token = second

            let first = try await LiveStream.open(env.social, alice)
            let other = try await LiveStream.open(env.social, aliceTwo)
            let bobs = try await LiveStream.open(env.social, bob)
            await env.core.checkSessionsOnce()
            #expect(!first.isFinished && !other.isFinished && !bobs.isFinished, "live sessions keep their streams")

            _ = try await env.accounts.logOut(Accounts_V1_LogOutRequest(), options: alice.options)
            await env.core.checkSessionsOnce()
            let ended = await first.waitUntilFinished()
            #expect(ended?.code == .unauthenticated)
            #expect(ended?.message.contains("revoked") == true)
            #expect(!other.isFinished && !bobs.isFinished, "other sessions and users are untouched")

            // "Log out everywhere" ends the rest of alice's.
            var all = Accounts_V1_LogOutRequest()
            all.allSessions = true
            _ = try await env.accounts.logOut(all, options: aliceTwo.options)
            await env.core.checkSessionsOnce()
            #expect(await other.waitUntilFinished()?.code == .unauthenticated)
            #expect(!bobs.isFinished)
            await bobs.cancel()
        }
    }

    @Test func whileAccountsIsDownStreamsStayOpen() async throws {
        try await withSocial(accountsDown: true) { env in
            let alice = try await env.user("alice")
            let stream = try await LiveStream.open(env.social, alice)
            await env.core.checkSessionsOnce()
            try await Task.sleep(for: .milliseconds(100))
            #expect(!stream.isFinished)
            await stream.cancel()
        }
    }

    @Test func checkSessionsNamesEndedAndUnknownSessionsAndRefusesBadBatches() async throws {
        try await withSocial { env in
            var r = Accounts_V1_CheckSessionsRequest()
            await expectFailure(.invalidArgument, fields: ["session_ids"]) { try await env.accountsInternal.checkSessions(r) }
            r.sessionIds = Array(repeating: "s", count: 1) + (0..<500).map { "s\($0)" }
            await expectFailure(.invalidArgument, fields: ["session_ids"]) { try await env.accountsInternal.checkSessions(r) }
            r.sessionIds = ["no-such-session", "no-such-session"]
            let answer = try await env.accountsInternal.checkSessions(r)
            #expect(answer.endedSessionIds == ["no-such-session"])
        }
    }
}
