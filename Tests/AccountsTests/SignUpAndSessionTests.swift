import Accounts
import Contracts
import Foundation
import RPCCore
import Security
import ServiceKit
import Testing

@Suite("Accounts: sign-up, log-in, sessions, guests, keys (gRPC on loopback)")
struct SignUpAndSessionTests {
    @Test func signUpCreatesTheAccountAndLogsItIn() async throws {
        try await withAccounts { env in
            var contact = Accounts_V1_ContactInfo()
            contact.phoneNumber = "+44 20 7946 0018"
            contact.publicEmail = "alice@studio.example"
            let name = uniqueName("Alice")
            let r = try await env.signUp(name, email: "  \(name)@Example.com ", displayName: " Alice Martin ", contact: contact)
            #expect(r.user.username == name)
            #expect(r.user.email == "\(name)@Example.com")  // trimmed, stored as given
            #expect(r.user.displayName == "Alice Martin")
            #expect(r.user.contactInfo == contact)
            #expect(!r.user.guest)
            #expect(r.user.userId.count == 26)
            #expect(r.session.refreshToken.count == 43)
            let lifetime = r.session.accessTokenExpiresAt.seconds - Int64(Date().timeIntervalSince1970)
            #expect((14 * 60...15 * 60).contains(lifetime))
            let refreshDays = (r.session.refreshTokenExpiresAt.seconds - Int64(Date().timeIntervalSince1970)) / 86400
            #expect(refreshDays == 29 || refreshDays == 30)

            // The access token is an EdDSA JWT that verifies with the published keys.
            let keys = try await env.accounts.getSigningKeys(Accounts_V1_GetSigningKeysRequest())
            let published = try Dictionary(uniqueKeysWithValues: keys.keys.map { ($0.keyId, try Ed25519PublicKey(rawRepresentation: $0.publicKey)) })
            let claims = try AccessToken.verify(r.session.accessToken, keys: published)
            #expect(claims.userID == r.user.userId)
            #expect(claims.sessionID == r.session.sessionId)
            #expect(claims.kind == .user)

            let me = try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(r.session))
            #expect(me.user == r.user)
        }
    }

    @Test func signUpNamesEveryRejectedFieldAtOnce() async throws {
        try await withAccounts { env in
            var contact = Accounts_V1_ContactInfo()
            contact.phoneNumber = "call me maybe"
            contact.publicEmail = "not-an-email"
            var r = signUpRequest("x!", email: "nobody@", password: "short", displayName: String(repeating: "n", count: 65), contact: contact)
            await expectFailure(
                .invalidArgument,
                fields: [
                    "username", "email", "password", "display_name",
                    "contact_info.phone_number", "contact_info.public_email",
                ]
            ) {
                try await env.accounts.signUp(r)
            }
            r = Accounts_V1_SignUpRequest()
            await expectFailure(.invalidArgument, fields: ["username", "email", "password"]) { try await env.accounts.signUp(r) }
            // The guest- prefix is reserved; 129-character passwords are too long.
            r = signUpRequest("Guest-abc", password: String(repeating: "p", count: 129))
            await expectFailure(.invalidArgument, fields: ["username", "password"]) { try await env.accounts.signUp(r) }
            for bad in ["a@b", "a b@example.com", "@example.com", "a@@example.com", "a@example..com", "a@-x.com"] {
                await expectFailure(.invalidArgument, fields: ["email"], "\(bad)") {
                    try await env.accounts.signUp(signUpRequest(uniqueName(), email: bad))
                }
            }
        }
    }

    @Test func takenUsernameAndEmailAreNamedCaseInsensitively() async throws {
        try await withAccounts { env in
            let name = uniqueName("Bob")
            try await env.signUp(name, email: "\(name)@example.com")
            await expectFailure(.alreadyExists, fields: ["username"]) {
                try await env.signUp(name.uppercased(), email: "other-\(name)@example.com")
            }
            await expectFailure(.alreadyExists, fields: ["email"]) {
                try await env.signUp(uniqueName(), email: "\(name.uppercased())@EXAMPLE.com")
            }
            await expectFailure(.alreadyExists, fields: ["username", "email"]) {
                try await env.signUp(name.lowercased(), email: "\(name)@example.COM")
            }
        }
    }

    @Test func concurrentSignUpsWithOneNameCreateOneAccount() async throws {
        try await withAccounts { env in
            let name = uniqueName()
            let results = await withTaskGroup(of: Bool.self) { group in
                for i in 0..<6 {
                    group.addTask { (try? await env.signUp(name, email: "\(name)-\(i)@example.com")) != nil }
                }
                return await group.reduce(into: [Bool]()) { $0.append($1) }
            }
            #expect(results.filter { $0 }.count == 1)
        }
    }

    @Test func logInByUsernameOrEmailCaseInsensitively() async throws {
        try await withAccounts { env in
            let name = uniqueName("Carol")
            let signed = try await env.signUp(name, email: "\(name)@Example.com")
            let a = try await env.accounts.logIn(logInRequest(username: name.uppercased(), password: "correct horse battery staple"))
            #expect(a.user.userId == signed.user.userId)
            #expect(a.session.sessionId != signed.session.sessionId)
            let b = try await env.accounts.logIn(logInRequest(email: "\(name.lowercased())@example.COM", password: "correct horse battery staple"))
            #expect(b.user.userId == signed.user.userId)
        }
    }

    @Test func wrongCredentialsGetOneGenericAnswer() async throws {
        try await withAccounts { env in
            let name = uniqueName()
            try await env.signUp(name)
            let wrongPassword = await expectFailure(.unauthenticated) { try await env.logIn(name, "wrong password!") }
            let unknownUser = await expectFailure(.unauthenticated) { try await env.logIn(uniqueName(), "wrong password!") }
            let unknownEmail = await expectFailure(.unauthenticated) {
                try await env.accounts.logIn(logInRequest(email: "nobody@example.com", password: "whatever1"))
            }
            #expect(wrongPassword?.message == unknownUser?.message)
            #expect(unknownUser?.message == unknownEmail?.message)
            // A malformed request is not a credential failure.
            await expectFailure(.invalidArgument, fields: ["username", "password"]) {
                try await env.accounts.logIn(Accounts_V1_LogInRequest())
            }
        }
    }

    @Test func repeatedFailuresForOneAccountAreThrottled() async throws {
        try await withAccounts({ c in
            c.maxFailuresPerAccount = 3
            c.failureWindow = .seconds(2)
        }) { env in
            let name = uniqueName()
            try await env.signUp(name)
            for _ in 0..<3 { await expectFailure(.unauthenticated) { try await env.logIn(name, "wrong password!") } }
            // Even the right password is refused now, with when to retry.
            let f = await expectFailure(.resourceExhausted) { try await env.logIn(name) }
            #expect((1...2).contains(f?.retryDelaySeconds ?? 0))
            #expect(f?.trailers["retry-after"] != nil)
            // Unknown accounts are throttled the same way (no enumeration through the throttle).
            let ghost = uniqueName()
            for _ in 0..<3 { await expectFailure(.unauthenticated) { try await env.logIn(ghost, "wrong password!") } }
            await expectFailure(.resourceExhausted) { try await env.logIn(ghost, "wrong password!") }
            // The window slides: after it, the account logs in again.
            try await Task.sleep(for: .milliseconds(2100))
            _ = try await env.logIn(name)
        }
    }

    @Test func repeatedFailuresFromOneAddressAreThrottled() async throws {
        try await withAccounts({ c in
            c.maxFailuresPerAddress = 4
            c.maxFailuresPerAccount = 100
        }) { env in
            let name = uniqueName()
            try await env.signUp(name)
            for _ in 0..<4 { await expectFailure(.unauthenticated) { try await env.logIn(uniqueName(), "wrong password!") } }
            let f = await expectFailure(.resourceExhausted) { try await env.logIn(name) }
            #expect((f?.retryDelaySeconds ?? 0) > 0)

            // Through the gateway (its credential), the client address is x-forwarded-for.
            let viaGateway = Accounts_V1_AccountsClient(
                RPCClient(transport: CredentialedTransport(base: env.channel, gatewayToken: testGatewayToken)))
            let forwarded = CallOptions(metadata: Metadata([("x-forwarded-for", "203.0.113.7")]))
            _ = try await viaGateway.logIn(logInRequest(username: name, password: "correct horse battery staple"), options: forwarded)
            // A client cannot pick its address without the credential: the header is ignored.
            await expectFailure(.resourceExhausted) {
                try await env.accounts.logIn(logInRequest(username: name, password: "correct horse battery staple"), options: forwarded)
            }
            // Nor can another service: only the gateway's credential vouches for x-forwarded-for.
            let viaService = Accounts_V1_AccountsClient(
                RPCClient(transport: CredentialedTransport(base: env.channel, serviceToken: testServiceToken)))
            await expectFailure(.resourceExhausted) {
                try await viaService.logIn(logInRequest(username: name, password: "correct horse battery staple"), options: forwarded)
            }
        }
    }

    @Test func refreshRotatesAndReuseRevokesTheSession() async throws {
        try await withAccounts { env in
            let first = try await env.signUp().session
            let second = try await env.accounts.refreshSession(refresh(first.refreshToken)).session
            #expect(second.sessionId == first.sessionId)
            #expect(second.refreshToken != first.refreshToken)
            // (The access token may equal the old one within the same second: same claims, same signature.)
            let third = try await env.accounts.refreshSession(refresh(second.refreshToken)).session
            _ = try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(third))

            // Presenting a rotated token again (a thief, or the victim after the thief): the whole
            // session is revoked, including the newest token and the access tokens here.
            let reuse = await expectFailure(.unauthenticated) { try await env.accounts.refreshSession(refresh(first.refreshToken)) }
            #expect(reuse?.message.contains("revoked") == true)
            await expectFailure(.unauthenticated) { try await env.accounts.refreshSession(refresh(third.refreshToken)) }
            await expectFailure(.unauthenticated) {
                try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(third))
            }
        }
    }

    @Test func refreshRejectsUnknownEmptyAndExpiredTokens() async throws {
        try await withAccounts({ $0.refreshTokenLifetime = .seconds(1) }) { env in
            await expectFailure(.invalidArgument, fields: ["refresh_token"]) { try await env.accounts.refreshSession(refresh("")) }
            await expectFailure(.unauthenticated) { try await env.accounts.refreshSession(refresh(SecureRandom.token())) }
            let s = try await env.signUp().session
            try await Task.sleep(for: .milliseconds(1200))
            let f = await expectFailure(.unauthenticated) { try await env.accounts.refreshSession(refresh(s.refreshToken)) }
            #expect(f?.message.contains("expired") == true)
        }
    }

    @Test func logOutRevokesThisSessionOrAll() async throws {
        try await withAccounts { env in
            let name = uniqueName()
            let a = try await env.signUp(name).session
            let b = try await env.logIn(name).session
            let c = try await env.logIn(name).session

            let one = try await env.accounts.logOut(Accounts_V1_LogOutRequest(), options: bearer(a))
            #expect(one.revokedSessions == 1)
            await expectFailure(.unauthenticated) { try await env.accounts.refreshSession(refresh(a.refreshToken)) }
            await expectFailure(.unauthenticated) { try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(a)) }
            _ = try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(b))

            var everywhere = Accounts_V1_LogOutRequest()
            everywhere.allSessions = true
            let all = try await env.accounts.logOut(everywhere, options: bearer(b))
            #expect(all.revokedSessions == 2)
            await expectFailure(.unauthenticated) { try await env.accounts.refreshSession(refresh(c.refreshToken)) }
            await expectFailure(.unauthenticated) { try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(c)) }
            // Authenticated RPCs need a token at all.
            await expectFailure(.unauthenticated) { try await env.accounts.logOut(Accounts_V1_LogOutRequest()) }
        }
    }

    @Test func guestsPlayWithoutCredentialsAndUpgradeKeepingTheirId() async throws {
        try await withAccounts { env in
            var create = Accounts_V1_CreateGuestRequest()
            create.displayName = "Kiwi"
            let guest = try await env.accounts.createGuest(create)
            #expect(guest.user.guest)
            #expect(guest.user.username.hasPrefix("guest-") && guest.user.username.count == 14)
            #expect(guest.user.email.isEmpty)
            #expect(guest.user.displayName == "Kiwi")
            let unnamed = try await env.accounts.createGuest(Accounts_V1_CreateGuestRequest())
            #expect(unnamed.user.displayName == "Guest")
            let claims = try AccessToken.verify(guest.session.accessToken, keys: env.core.keys.verificationKeys)
            #expect(claims.kind == .guest)

            // No password: a guest cannot log in by its generated name, nor change a password.
            await expectFailure(.unauthenticated) { try await env.logIn(guest.user.username, "anything-at-all") }
            var change = Accounts_V1_ChangePasswordRequest()
            change.currentPassword = "anything-at-all"
            change.newPassword = "something-else-1"
            await expectFailure(.failedPrecondition) { try await env.accounts.changePassword(change, options: bearer(guest.session)) }

            // Upgrade: same field rules as sign-up, every bad field named.
            var bad = Accounts_V1_UpgradeGuestRequest()
            bad.username = "guest-me"
            bad.email = "x"
            await expectFailure(.invalidArgument, fields: ["username", "email", "password"]) {
                try await env.accounts.upgradeGuest(bad, options: bearer(guest.session))
            }
            let taken = try await env.signUp()
            var upgrade = Accounts_V1_UpgradeGuestRequest()
            upgrade.username = taken.user.username
            upgrade.email = "kiwi-\(UUID().uuidString.prefix(8))@example.org"
            upgrade.password = "tangerine-otter-42"
            await expectFailure(.alreadyExists, fields: ["username"]) {
                try await env.accounts.upgradeGuest(upgrade, options: bearer(guest.session))
            }
            upgrade.username = uniqueName("kiwi")
            var contact = Accounts_V1_ContactInfo()
            contact.phoneNumber = "+1 (604) 555-0142"
            upgrade.contactInfo = contact
            let upgraded = try await env.accounts.upgradeGuest(upgrade, options: bearer(guest.session))
            #expect(upgraded.user.userId == guest.user.userId)
            #expect(!upgraded.user.guest)
            #expect(upgraded.user.displayName == "Kiwi")  // empty keeps the current one
            #expect(upgraded.user.contactInfo == contact)
            #expect(try AccessToken.verify(upgraded.session.accessToken, keys: env.core.keys.verificationKeys).kind == .user)
            // The guest session is over; the account now logs in with its credentials.
            await expectFailure(.unauthenticated) { try await env.accounts.refreshSession(refresh(guest.session.refreshToken)) }
            _ = try await env.logIn(upgrade.username, "tangerine-otter-42")
            await expectFailure(.failedPrecondition) {
                try await env.accounts.upgradeGuest(upgrade, options: bearer(upgraded.session))
            }
        }
    }

    @Test func signingKeysArePublishedAndRotate() async throws {
        try await withAccounts { env in
            let before = try await env.accounts.getSigningKeys(Accounts_V1_GetSigningKeysRequest())
            #expect(before.keys.count == 1)
            let key = try #require(before.keys.first)
            #expect(key.current && key.algorithm == .ed25519 && key.publicKey.count == 32 && !key.hasRetiredAt)
            #expect(key.keyId == (try Ed25519PublicKey(rawRepresentation: key.publicKey)).keyID)
            #expect(before.cacheFor.seconds == 300)
            let old = try await env.signUp().session

            try env.core.keys.rotate()
            let after = try await env.accounts.getSigningKeys(Accounts_V1_GetSigningKeysRequest())
            #expect(after.keys.count == 2)
            #expect(after.keys[0].current && after.keys[0].keyId != key.keyId)
            #expect(!after.keys[1].current && after.keys[1].keyId == key.keyId && after.keys[1].hasRetiredAt)
            #expect(after.keys[1].retiredAt.seconds >= Int64(Date().timeIntervalSince1970) + 15 * 60)
            // Tokens signed with the retired key still work; new ones carry the new key id.
            _ = try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(old))
            let fresh = try await env.signUp().session
            let claims = try AccessToken.verify(fresh.accessToken, keys: env.core.keys.verificationKeys)
            #expect(claims.keyID == after.keys[0].keyId)
            _ = try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(fresh))
        }
    }

    @Test func forgedAndForeignTokensAreRefused() async throws {
        try await withAccounts { env in
            let s = try await env.signUp().session
            var tampered = Array(s.accessToken)
            tampered[tampered.count - 5] = tampered[tampered.count - 5] == "A" ? "B" : "A"
            await expectFailure(.unauthenticated) {
                try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(String(tampered)))
            }
            let foreign = AccessToken.sign(
                AccessTokenClaims(
                    userID: "x", sessionID: "y", expiresAt: AccessToken.currentTime() + 60, issuedAt: AccessToken.currentTime(),
                    keyID: "made-up", kind: .user), with: Ed25519KeyPair())
            await expectFailure(.unauthenticated) {
                try await env.accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: bearer(foreign))
            }
            // Internal RPCs need the service credential, not a user token.
            var lookup = Accounts_V1_ResolveUsernamesRequest()
            lookup.usernames = ["x"]
            await expectFailure(.permissionDenied) {
                try await Accounts_V1_AccountsInternalClient(env.channel.client).resolveUsernames(lookup, options: bearer(s))
            }
        }
    }
}

func refresh(_ token: String) -> Accounts_V1_RefreshSessionRequest {
    var r = Accounts_V1_RefreshSessionRequest()
    r.refreshToken = token
    return r
}
