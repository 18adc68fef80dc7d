import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Social
import Storage
import Testing

/// "Retried requests create nothing twice": CreateTeam, CreateHousehold and InviteHousemate take
/// an optional `idempotency_key`. A retry with the same key and request gets the first answer and
/// creates, mails and notifies nothing again (also when the retries run at once); the same key
/// with another request is FAILED_PRECONDITION naming `idempotency_key`; without a key every
/// request is a new one, as before the key existed.
@Suite("Social: retried creations (idempotency_key)", .serialized)
struct IdempotencyTests {
    /// Runs `call` `n` times at once: every answer, or the failure's code.
    static func atOnce<R: Sendable>(_ n: Int, _ call: @escaping @Sendable () async throws -> R) async -> [Result<R, RPCError>] {
        await withTaskGroup(of: Result<R, RPCError>.self) { group in
            for _ in 0..<n {
                group.addTask {
                    do { return .success(try await call()) } catch let e as RPCError { return .failure(e) } catch {
                        return .failure(RPCError(.unknown, "\(error)"))
                    }
                }
            }
            var out: [Result<R, RPCError>] = []
            for await r in group { out.append(r) }
            return out
        }
    }

    /// Waits until social's outbox delivered everything (the invite mails reached accounts).
    static func delivered(_ env: SocialEnv, sourceLocation: SourceLocation = #_sourceLocation) async {
        let done = await eventually(timeout: .seconds(20)) { (try? await env.core.database.pendingOutbox(limit: 1).isEmpty) == true }
        #expect(done, "social's outbox still holds undelivered calls", sourceLocation: sourceLocation)
    }

    /// SendMail calls social ever queued (one per invite mail).
    static func queuedMails(_ env: SocialEnv) throws -> Int64 {
        try env.core.database.readSync { c in
            try c.queryOne("SELECT count(*) FROM outbox WHERE kind = ?", Accounts_V1_AccountsInternalMethods.sendMail.path)!.get(0, as: Int64.self)
        }
    }

    static func count(_ env: SocialEnv, _ table: String) throws -> Int64 {
        try env.core.database.readSync { c in try c.queryOne("SELECT count(*) FROM \(table)")!.get(0, as: Int64.self) }
    }

    static func households(_ env: SocialEnv, _ user: User) async throws -> [Social_V1_Household] {
        var r = Social_V1_ListMyHouseholdsRequest()
        r.pageSize = 100
        return try await env.social.listMyHouseholds(r, options: user.options).households
    }

    static func inbox(_ env: SocialEnv, _ user: User, _ kind: Social_V1_NotificationKind) async throws -> [Social_V1_Notification] {
        var r = Social_V1_ListNotificationsRequest()
        r.pageSize = 100
        return try await env.social.listNotifications(r, options: user.options).notifications.filter { $0.kind == kind }
    }

    // MARK: CreateHousehold

    static func household(name: String = "Maple Street 12", invite: [String] = [], key: String) -> Social_V1_CreateHouseholdRequest {
        var r = Social_V1_CreateHouseholdRequest()
        r.name = name
        r.inviteEmails = invite
        r.idempotencyKey = key
        return r
    }

    @Test func createHouseholdRetriedWithItsKeyIsMadeAndMailedOnce() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            let newcomer = "\(uniqueName("new"))@example.org"
            // Without a key, as before: every request is a new household.
            let plain = Self.household(name: "No key", key: "")
            let x = try await env.social.createHousehold(plain, options: alice.options)
            let y = try await env.social.createHousehold(plain, options: alice.options)
            #expect(x.household.householdId != y.household.householdId)

            let r = Self.household(invite: [bob.email, newcomer], key: "c0ffee00-7d41-4f0a-8e1b-5a6b7c8d9e0f")
            let first = try await env.social.createHousehold(r, options: alice.options)
            #expect(first.invites.count == 2)
            // The answer was lost; the client sends the same request again: the first answer,
            // one household, one mail per invite, one in-app note for bob.
            let again = try await env.social.createHousehold(r, options: alice.options)
            #expect(again == first)
            let mine = try await Self.households(env, alice).map(\.householdId)
            #expect(Set(mine) == Set([x, y, first].map(\.household.householdId)) && mine.count == 3)
            await Self.delivered(env)
            #expect(try Self.queuedMails(env) == 2)
            #expect(try await env.mails(to: newcomer).count == 1)
            #expect(try await env.mails(to: bob.email).map { $0.data["invite_code"] } == [first.invites[0].inviteCode])
            #expect(try await Self.inbox(env, bob, .householdInvite).count == 1)
            // The mailed codes are the ones of the answer, and they work.
            let joined = try await HouseholdsTests.join(env, bob, first.invites[0].inviteCode)
            #expect(joined.householdId == first.household.householdId)
        }
    }

    /// The stored answers hold what the user sent (invitees' emails): they go with the user.
    @Test func erasingTheUserDeletesTheirStoredAnswers() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            _ = try await env.social.createHousehold(Self.household(invite: ["x@example.org"], key: "k-alice"), options: alice.options)
            _ = try await env.social.createHousehold(Self.household(key: "k-bob"), options: bob.options)
            #expect(try Self.count(env, "idempotency_keys") == 2)
            var erase = Social_V1_EraseUserRequest()
            erase.eventId = "evt-erase-alice"
            erase.userId = alice.id
            _ = try await env.internalAPI.eraseUser(erase)
            let scopes = try env.core.database.readSync { c in
                try c.query("SELECT scope FROM idempotency_keys").map { try $0.get(0, as: String.self) }
            }
            #expect(scopes == ["CreateHousehold:\(bob.id)"], "bob's answer stays")
        }
    }

    @Test func createHouseholdRetriedAtOnceIsMadeOnce() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice")
            let newcomer = "\(uniqueName("new"))@example.org"
            let r = Self.household(invite: [newcomer], key: "retry-at-once")
            let racing = await Self.atOnce(6) { try await env.social.createHousehold(r, options: alice.options) }
            let answers = try racing.map { try $0.get() }
            #expect(answers.allSatisfy { $0 == answers[0] })
            #expect(try await Self.households(env, alice).map(\.householdId) == [answers[0].household.householdId])
            await Self.delivered(env)
            #expect(try Self.queuedMails(env) == 1)
            #expect(try await env.mails(to: newcomer).count == 1)
        }
    }

    @Test func createHouseholdWithAKeyUsedForAnotherRequestIsRefused() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            let r = Self.household(invite: ["newcomer@example.org"], key: "k-1")
            let first = try await env.social.createHousehold(r, options: alice.options)
            // Another name, other invites: FAILED_PRECONDITION naming the key; nothing made.
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) {
                try await env.social.createHousehold(
                    Self.household(name: "Elm Road 3", invite: ["newcomer@example.org"], key: "k-1"), options: alice.options)
            }
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) {
                try await env.social.createHousehold(Self.household(key: "k-1"), options: alice.options)
            }
            #expect(try await Self.households(env, alice).map(\.householdId) == [first.household.householdId])
            #expect(try Self.queuedMails(env) == 1)

            // Keys are the caller's: bob's request with alice's key is his own.
            let bobs = try await env.social.createHousehold(Self.household(key: "k-1"), options: bob.options)
            #expect(bobs.household.createdByUserId == bob.id && bobs.household.householdId != first.household.householdId)

            // A key must be 1..64 printable ASCII characters.
            for bad in [String(repeating: "k", count: 65), "tab\tkey", "clé"] {
                await expectFailure(.invalidArgument, fields: ["idempotency_key"]) {
                    try await env.social.createHousehold(Self.household(key: bad), options: alice.options)
                }
            }
            #expect(try await Self.households(env, alice).count == 1)
        }
    }

    // MARK: InviteHousemate

    static func invite(_ household: String, _ email: String, key: String) -> Social_V1_InviteHousemateRequest {
        var r = Social_V1_InviteHousemateRequest()
        r.householdId = household
        r.email = email
        r.idempotencyKey = key
        return r
    }

    static func pending(_ env: SocialEnv, _ household: String, by member: User) async throws -> [Social_V1_HouseholdInvite] {
        var get = Social_V1_GetHouseholdRequest()
        get.householdId = household
        return try await env.social.getHousehold(get, options: member.options).pendingInvites
    }

    @Test func inviteHousemateRetriedWithItsKeyMakesOneCodeAndOneMail() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), dave = try await env.user("dave")
            let household = try await HouseholdsTests.create(env, alice).household.householdId
            // Without a key, as before: a second invite replaces the first and is mailed again.
            let frank = "\(uniqueName("frank"))@example.org"
            let one = try await env.social.inviteHousemate(Self.invite(household, frank, key: ""), options: alice.options)
            let two = try await env.social.inviteHousemate(Self.invite(household, frank, key: ""), options: alice.options)
            #expect(one.invite.inviteCode != two.invite.inviteCode)
            #expect(try await Self.pending(env, household, by: alice) == [two.invite])

            let r = Self.invite(household, dave.email, key: "invite-dave-1")
            let first = try await env.social.inviteHousemate(r, options: alice.options)
            // A retry: the same invite (its code not replaced by a second one), one mail, one note.
            let again = try await env.social.inviteHousemate(r, options: alice.options)
            #expect(again == first)
            #expect(try await Self.pending(env, household, by: alice).filter { $0.email == dave.email } == [first.invite])
            await Self.delivered(env)
            #expect(try await env.mails(to: frank).count == 2)
            #expect(try await env.mails(to: dave.email).map { $0.data["invite_code"] } == [first.invite.inviteCode])
            #expect(try await Self.inbox(env, dave, .householdInvite).count == 1)
            #expect(try Self.queuedMails(env) == 3)
            // The replayed code is the live one: dave joins with it.
            let joined = try await HouseholdsTests.join(env, dave, first.invite.inviteCode)
            #expect(joined.members.map(\.user.userId) == [alice.id, dave.id])
        }
    }

    @Test func inviteHousemateRetriedAtOnceMakesOneCodeAndOneMail() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), dave = try await env.user("dave")
            let household = try await HouseholdsTests.create(env, alice).household.householdId
            let r = Self.invite(household, dave.email, key: "invite-at-once")
            let racing = await Self.atOnce(6) { try await env.social.inviteHousemate(r, options: alice.options) }
            let answers = try racing.map { try $0.get() }
            #expect(answers.allSatisfy { $0 == answers[0] })
            #expect(try await Self.pending(env, household, by: alice) == [answers[0].invite])
            await Self.delivered(env)
            #expect(try await env.mails(to: dave.email).count == 1)
            #expect(try await Self.inbox(env, dave, .householdInvite).count == 1)
        }
    }

    @Test func inviteHousemateWithAKeyUsedForAnotherRequestIsRefused() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), dave = try await env.user("dave")
            let household = try await HouseholdsTests.create(env, alice).household.householdId
            let first = try await env.social.inviteHousemate(Self.invite(household, dave.email, key: "k-1"), options: alice.options)
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) {
                try await env.social.inviteHousemate(Self.invite(household, "someone.else@example.org", key: "k-1"), options: alice.options)
            }
            #expect(try await Self.pending(env, household, by: alice) == [first.invite])
            #expect(try Self.queuedMails(env) == 1)
            // Keys are per method: the same key on CreateHousehold is a request of its own.
            let second = try await env.social.createHousehold(Self.household(name: "Second home", key: "k-1"), options: alice.options)
            #expect(second.household.householdId != household)
        }
    }

    // MARK: CreateTeam

    static func team(_ name: String = "Night Owls", members: [User] = [], key: String) -> Social_V1_CreateTeamRequest {
        var r = Social_V1_CreateTeamRequest()
        r.name = name
        r.memberUsernames = members.map(\.username)
        r.idempotencyKey = key
        return r
    }

    @Test func createTeamRetriedWithItsKeyGetsTheTeamInsteadOfARefusal() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob"), carol = try await env.user("carol")
            let frank = try await env.user("frank")
            // Without a key, as before: the second request is refused (already in a team).
            _ = try await env.social.createTeam(Self.team("Solo", key: ""), options: frank.options)
            await expectFailure(.failedPrecondition) { try await env.social.createTeam(Self.team("Solo", key: ""), options: frank.options) }

            let r = Self.team(members: [bob, carol], key: "team-night-owls")
            let first = try await env.social.createTeam(r, options: alice.options)
            #expect(first.team.members.map(\.userId) == [alice.id, bob.id, carol.id])
            // A retry gets the team (not "you are already in a team"); members are told once.
            let again = try await env.social.createTeam(r, options: alice.options)
            #expect(again == first)
            #expect(try Self.count(env, "teams") == 2)
            #expect(try await Self.inbox(env, bob, .teamJoined).count == 1)
            #expect(try await Self.inbox(env, carol, .teamJoined).count == 1)
        }
    }

    @Test func createTeamRetriedAtOnceIsMadeOnce() async throws {
        try await withSocial { env in
            let dave = try await env.user("dave"), erin = try await env.user("erin")
            let r = Self.team("Racers", members: [erin], key: "team-racers")
            let racing = await Self.atOnce(6) { try await env.social.createTeam(r, options: dave.options) }
            let answers = try racing.map { try $0.get() }
            #expect(answers.allSatisfy { $0 == answers[0] })
            #expect(try Self.count(env, "teams") == 1)
            #expect(try await env.social.getMyTeam(Social_V1_GetMyTeamRequest(), options: dave.options).team.teamId == answers[0].team.teamId)
            #expect(try await Self.inbox(env, erin, .teamJoined).count == 1)
        }
    }

    @Test func createTeamWithAKeyUsedForAnotherRequestIsRefusedNamingTheKey() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            _ = try await env.social.createTeam(Self.team(members: [bob], key: "k-1"), options: alice.options)
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) {
                try await env.social.createTeam(Self.team("Early Birds", members: [bob], key: "k-1"), options: alice.options)
            }
            // Keys are the caller's: bob's request with alice's key is his own (and refused for
            // what it asks: he is in alice's team).
            let bobs = await expectFailure(.failedPrecondition) {
                try await env.social.createTeam(Self.team(members: [bob], key: "k-1"), options: bob.options)
            }
            #expect(bobs?.fields.contains("idempotency_key") == false)
            #expect(try Self.count(env, "teams") == 1)
        }
    }

    // MARK: Before any peer

    @Test func aRetryIsAnsweredFromItsKeyWhileAccountsIsDown() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            var team = Self.team(members: [bob], key: "team-1")
            let firstTeam = try await env.social.createTeam(team, options: alice.options)
            let household = Self.household(invite: ["newcomer@example.org"], key: "household-1")
            let firstHousehold = try await env.social.createHousehold(household, options: alice.options)
            let invite = Self.invite(firstHousehold.household.householdId, bob.email, key: "invite-1")
            let firstInvite = try await env.social.inviteHousemate(invite, options: alice.options)

            env.cluster.setDown(.accounts, true)
            #expect(try await env.social.createTeam(team, options: alice.options) == firstTeam)
            #expect(try await env.social.createHousehold(household, options: alice.options) == firstHousehold)
            #expect(try await env.social.inviteHousemate(invite, options: alice.options) == firstInvite)
            // A key reused for another request is refused before accounts is asked about a user
            // social never met (which would be UNAVAILABLE now).
            team.memberUsernames = [uniqueName("never_met")]
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) {
                try await env.social.createTeam(team, options: alice.options)
            }
            env.cluster.setDown(.accounts, false)

            #expect(try Self.count(env, "teams") == 1)
            #expect(try await Self.households(env, alice).count == 1)
            await Self.delivered(env)
            #expect(try Self.queuedMails(env) == 2)
            #expect(try await env.mails(to: bob.email).count == 1)
        }
    }
}
