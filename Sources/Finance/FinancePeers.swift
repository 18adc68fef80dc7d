import Contracts
import Foundation
import Logging
import RPCCore
import ServiceKit
import Synchronization

/// The synchronous reads finance makes of its peers (DESIGN.md: reads only, short deadline, a
/// clear degraded answer while the peer is down):
/// - social's `CheckHouseholdMembership`: no answer → UNAVAILABLE ("nothing was recorded"); money
///   is never recorded on an unconfirmed membership;
/// - accounts' `GetUsersByIds` for display names: no answer → ids only (names empty), cached
///   answers reused.
final class FinancePeers: Sendable {
    let peers: PeerClients
    let configuration: FinanceConfiguration
    let logger: Logger
    private let names = Mutex<[String: (ref: Common_V1_UserRef, until: ContinuousClock.Instant)]>([:])
    static let deletedUserName = "Deleted user"
    static let maxCachedNames = 20_000

    init(peers: PeerClients, configuration: FinanceConfiguration, logger: Logger) {
        self.peers = peers
        self.configuration = configuration
        self.logger = logger
    }

    /// A household as social sees it.
    struct Household: Sendable {
        var state: Social_V1_HouseholdState
        var memberships: [String: Social_V1_MembershipState]
        var members: [String]
        var active: Bool { state == .active }
        func state(of user: String) -> Social_V1_MembershipState { memberships[user] ?? (members.contains(user) ? .member : .notMember) }
    }

    /// Why membership is asked: the answer while social is down says what did not happen.
    enum Purpose { case read, write }

    /// Asks social about `household` and `users` (≤ 50). Throws NOT_FOUND when it does not exist,
    /// UNAVAILABLE (with a retry hint) when social does not answer in time.
    func household(_ id: String, users: [String], purpose: Purpose) async throws -> Household {
        var request = Social_V1_CheckHouseholdMembershipRequest()
        request.householdId = id
        request.userIds = Array(Set(users)).sorted()
        do {
            let r = try await Social_V1_SocialInternalClient(peers.client("social"))
                .checkHouseholdMembership(request, options: CallOptions(timeout: configuration.membershipTimeout))
            return Household(state: r.state, memberships: r.memberships, members: r.memberUserIds)
        } catch let e as RPCError where e.code == .notFound {
            throw RPCError(.notFound, "no such household")
        } catch let e as RPCError where e.code == .invalidArgument {
            throw RPCError(.notFound, "no such household")
        } catch {
            logger.warning("social did not confirm a household membership", metadata: ["household": "\(id)", "error": "\(error)"])
            throw RPCError.retryLater(
                "household membership cannot be confirmed right now (the social service is unavailable): "
                    + (purpose == .write ? "nothing was recorded; " : "") + "retry in a few seconds",
                after: .seconds(2), code: .unavailable)
        }
    }

    /// Display names for `ids`, from the cache or accounts; ids accounts does not know (deleted)
    /// and `erased` ones are "Deleted user"; while accounts is down, ids only.
    func userRefs(_ ids: [String], erased: Set<String>) async -> [String: Common_V1_UserRef] {
        let now = ContinuousClock.now
        var out: [String: Common_V1_UserRef] = [:]
        var missing: [String] = []
        names.withLock { cache in
            for id in Set(ids) {
                if erased.contains(id) {
                    out[id] = Self.deleted(id)
                } else if let hit = cache[id], hit.until > now {
                    out[id] = hit.ref
                } else {
                    missing.append(id)
                }
            }
        }
        guard !missing.isEmpty else { return out }
        missing.sort()
        for start in stride(from: 0, to: missing.count, by: 200) {
            var request = Accounts_V1_GetUsersByIdsRequest()
            request.userIds = Array(missing[start..<min(missing.count, start + 200)])
            do {
                let r = try await Accounts_V1_AccountsInternalClient(peers.client("accounts"))
                    .getUsersByIds(request, options: CallOptions(timeout: configuration.namesTimeout))
                var fresh: [String: Common_V1_UserRef] = [:]
                for id in request.userIds { fresh[id] = r.usersById[id] ?? Self.deleted(id) }
                let until = ContinuousClock.now + configuration.namesCacheFor
                names.withLock { cache in
                    if cache.count > Self.maxCachedNames { cache.removeAll() }
                    for (id, ref) in fresh { cache[id] = (ref, until) }
                }
                out.merge(fresh) { $1 }
            } catch {
                logger.notice("display names unavailable (accounts did not answer): ids only", metadata: ["error": "\(error)"])
                for id in request.userIds {
                    var ref = Common_V1_UserRef()
                    ref.userId = id
                    out[id] = ref
                }
            }
        }
        return out
    }

    static func idOnly(_ id: String) -> Common_V1_UserRef {
        var ref = Common_V1_UserRef()
        ref.userId = id
        return ref
    }

    static func deleted(_ id: String) -> Common_V1_UserRef {
        var ref = Common_V1_UserRef()
        ref.userId = id
        ref.displayName = deletedUserName
        return ref
    }
}
