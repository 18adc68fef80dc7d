import Contracts
import Foundation
import RPCCore
import Security
import ServiceKit
import ServiceKitTesting
import Synchronization

// The setups tests share, each through the services' real public APIs: users sign up with
// accounts; households are created, joined with the invite code accounts mailed, left and deleted
// in social; friends, teams, follows and blocks are made in social; notifications are read from
// social's inbox; money (balances, histories) is read from finance.

private let counter = Mutex(0)

extension ServiceCluster {
    /// A fresh, unique username (letters, digits and "_").
    public static func uniqueName(_ prefix: String = "u") -> String {
        let n = counter.withLock { c in
            c += 1; return c
        }
        return "\(prefix)\(n)_\(SecureRandom.token(bytes: 3).lowercased().filter { $0.isLetter || $0.isNumber })"
    }

    /// Signs a user up with accounts (username unique unless given; email `<username>@example.com`).
    public func signUp(
        _ username: String? = nil, prefix: String = "u", displayName: String? = nil, email: String? = nil,
        password: String = "correct horse battery staple"
    ) async throws -> ClusterUser {
        let name = username ?? Self.uniqueName(prefix)
        var r = Accounts_V1_SignUpRequest()
        r.username = name
        r.email = email ?? "\(name.replacingOccurrences(of: ".", with: "_"))@example.com"
        r.password = password
        r.displayName = displayName ?? name.capitalized
        let s = try await accounts.signUp(r)
        return ClusterUser(id: s.user.userId, username: name, email: r.email, displayName: r.displayName, token: s.session.accessToken)
    }

    // MARK: Households (social)

    /// A household `members[0]` creates, the others joining with the codes accounts mailed them,
    /// in order. Returns its id.
    @discardableResult
    public func household(_ members: [ClusterUser], name: String = "Home") async throws -> String {
        guard let founder = members.first else { throw RPCError(.invalidArgument, "a household needs a member") }
        var r = Social_V1_CreateHouseholdRequest()
        r.name = name
        let id = try await social.createHousehold(r, options: founder.options).household.householdId
        for m in members.dropFirst() { try await join(id, m, invitedBy: founder) }
        return id
    }

    /// `inviter` invites `user` by email; `user` joins with the code from the mail.
    public func join(_ household: String, _ user: ClusterUser, invitedBy inviter: ClusterUser) async throws {
        var invite = Social_V1_InviteHousemateRequest()
        invite.householdId = household
        invite.email = user.email
        _ = try await social.inviteHousemate(invite, options: inviter.options)
        let code = try await inviteCode(to: user.email, household: household)
        var join = Social_V1_JoinHouseholdRequest()
        join.inviteCode = code
        _ = try await social.joinHousehold(join, options: user.options)
    }

    /// The newest invite code for `household` in accounts' mail sink for `email` (waits for the
    /// mail: social's outbox sends it).
    public func inviteCode(to email: String, household: String, timeout: Duration = .seconds(10)) async throws -> String {
        var code: String?
        _ = try await eventually(timeout: timeout) {
            var r = Accounts_V1_ListSentMailRequest()
            r.toEmail = email
            r.kind = .householdInvite
            r.pageSize = 100
            let mails = try await accountsInternal.listSentMail(r).mails.filter { $0.data["household_id"] == household }
            code = mails.max { $0.mailId < $1.mailId }?.data["invite_code"]
            return code != nil
        }
        guard let code else { throw RPCError(.deadlineExceeded, "no invite mail to \(email) for \(household)") }
        return code
    }

    /// `user` leaves the household (a former member from then on).
    public func leave(_ household: String, _ user: ClusterUser) async throws {
        var r = Social_V1_RemoveHousemateRequest()
        r.householdId = household
        r.userId = user.id
        _ = try await social.removeHousemate(r, options: user.options)
    }

    /// `member` deletes the household.
    public func deleteHousehold(_ household: String, by member: ClusterUser) async throws {
        var r = Social_V1_DeleteHouseholdRequest()
        r.householdId = household
        _ = try await social.deleteHousehold(r, options: member.options)
    }

    /// The household as its members' services see it (SocialInternal.CheckHouseholdMembership).
    public func membership(_ household: String, of users: [String] = []) async throws -> Social_V1_CheckHouseholdMembershipResponse {
        var r = Social_V1_CheckHouseholdMembershipRequest()
        r.householdId = household
        r.userIds = users
        return try await socialInternal.checkHouseholdMembership(r)
    }

    // MARK: Friends and teams (social)

    /// `a` befriends `b` (mutual at once).
    public func befriend(_ a: ClusterUser, _ b: ClusterUser) async throws {
        var r = Social_V1_AddFriendRequest()
        r.user.userId = b.id
        _ = try await social.addFriend(r, options: a.options)
    }

    /// A team `members[0]` creates with the others; returns its id.
    @discardableResult
    public func team(_ members: [ClusterUser], name: String = "Team") async throws -> String {
        guard let founder = members.first else { throw RPCError(.invalidArgument, "a team needs a member") }
        var r = Social_V1_CreateTeamRequest()
        r.name = name
        r.memberUsernames = members.dropFirst().map(\.username)
        return try await social.createTeam(r, options: founder.options).team.teamId
    }

    /// A team's score (as its member sees it).
    public func teamScore(of member: ClusterUser) async throws -> Int64 {
        try await social.getMyTeam(Social_V1_GetMyTeamRequest(), options: member.options).team.score
    }

    // MARK: Follows and blocks (social)

    /// `follower` asks to follow `followed`, who accepts: `follower` follows them from then on.
    public func follow(_ follower: ClusterUser, _ followed: ClusterUser) async throws {
        var r = Social_V1_RequestFollowRequest()
        r.user.userId = followed.id
        _ = try await social.requestFollow(r, options: follower.options)
        var a = Social_V1_AcceptFollowRequestRequest()
        a.requesterUserId = follower.id
        _ = try await social.acceptFollowRequest(a, options: followed.options)
    }

    /// `blocker` blocks `blocked` (social drops friendship, follows and follow requests between
    /// them, both ways).
    public func block(_ blocker: ClusterUser, _ blocked: ClusterUser) async throws {
        var r = Social_V1_BlockUserRequest()
        r.user.userId = blocked.id
        _ = try await social.blockUser(r, options: blocker.options)
    }

    // MARK: Money (finance)

    /// `user`'s whole history with `other` in finance, newest first: in `household`, or in the
    /// marketplace (settlements of done tasks) when it is empty.
    public func transactions(of user: ClusterUser, with other: ClusterUser, household: String = "") async throws -> [Finance_V1_TransactionEntry] {
        var out: [Finance_V1_TransactionEntry] = []
        var r = Finance_V1_ListTransactionsRequest()
        r.householdId = household
        r.counterpartUserId = other.id
        r.pageSize = 100
        repeat {
            let page = try await finance.listTransactions(r, options: user.options)
            out += page.entries
            r.pageToken = page.nextPageToken
        } while !r.pageToken.isEmpty
        return out
    }

    /// `user`'s balances in finance, one per counterpart and currency: in `household`, or in the
    /// marketplace when it is empty.
    public func balances(of user: ClusterUser, household: String = "") async throws -> [Finance_V1_Balance] {
        var r = Finance_V1_GetBalancesRequest()
        r.householdId = household
        return try await finance.getBalances(r, options: user.options).balances
    }

    // MARK: Notifications (social's inbox)

    /// Every notification in `user`'s inbox, newest first (optionally only `kinds`).
    public func notifications(of user: ClusterUser, kinds: [Social_V1_NotificationKind] = []) async throws -> [Social_V1_Notification] {
        var out: [Social_V1_Notification] = []
        var token = ""
        repeat {
            var r = Social_V1_ListNotificationsRequest()
            r.kinds = kinds
            r.pageSize = 100
            r.pageToken = token
            let page = try await social.listNotifications(r, options: user.options)
            out += page.notifications
            token = page.nextPageToken
        } while !token.isEmpty
        return out
    }

    /// Waits until `user`'s inbox holds a notification matching `match`; returns the matches.
    @discardableResult
    public func waitForNotifications(
        of user: ClusterUser, kinds: [Social_V1_NotificationKind] = [], count: Int = 1, timeout: Duration = .seconds(10),
        where match: @escaping (Social_V1_Notification) -> Bool = { _ in true }
    ) async throws -> [Social_V1_Notification] {
        var found: [Social_V1_Notification] = []
        _ = try await eventually(timeout: timeout) {
            found = try await notifications(of: user, kinds: kinds).filter(match)
            return found.count >= count
        }
        return found
    }
}
