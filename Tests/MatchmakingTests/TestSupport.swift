import Accounts
import Contracts
import Foundation
import GRPCContracts
import Logging
import Matchmaking
import RPCCore
import RPCTransport
import Security
import ServiceCluster
import ServiceKit
import ServiceKitTesting
import Social
import Storage
import Synchronization
import Testing

// Real components over real gRPC on loopback: the real accounts (cheap scrypt) as token issuer and
// name source, the real social (friends, blocks, CheckRelationship, notifications), matchmaking on
// the kit's TestServer; each service's outbox delivered to its peers as the host does it.

/// A port nothing listens on (a peer that is down): held by this process for its whole life, so no
/// other test's server can take it.
func closedPort() -> Int { ClosedPort.process }

struct Player: Sendable {
    var id: String
    var username: String
    var token: String
    var options: CallOptions { bearer(token) }
    func options(timeout: Duration) -> CallOptions { bearer(token, timeout: timeout) }
}

let nameCounter = Mutex(0)
func uniqueName(_ prefix: String = "p") -> String {
    "\(prefix)\(nameCounter.withLock { $0 += 1; return $0 })x\(SecureRandom.token(bytes: 3).lowercased().filter { $0.isLetter || $0.isNumber })"
}

final class MatchEnv: Sendable {
    let directory: TemporaryDirectory
    let accountsCore: AccountsCore
    let accountsServer: TestServer
    let socialCore: SocialCore?
    let socialServer: TestServer?
    let core: MatchmakingCore
    let server: TestServer
    let clock: ManualClock
    let jobs: Task<Void, Never>

    var mm: Matchmaking_V1_MatchmakingClient { Matchmaking_V1_MatchmakingClient(server.gateway) }
    var internalAPI: Matchmaking_V1_MatchmakingInternalClient { Matchmaking_V1_MatchmakingInternalClient(server.service) }
    var accounts: Accounts_V1_AccountsClient { Accounts_V1_AccountsClient(accountsServer.anonymous) }
    var social: Social_V1_SocialClient { Social_V1_SocialClient(socialServer!.gateway) }

    private init(
        directory: TemporaryDirectory, accountsCore: AccountsCore, accountsServer: TestServer, socialCore: SocialCore?,
        socialServer: TestServer?, core: MatchmakingCore, server: TestServer, clock: ManualClock, jobs: Task<Void, Never>
    ) {
        self.directory = directory
        self.accountsCore = accountsCore
        self.accountsServer = accountsServer
        self.socialCore = socialCore
        self.socialServer = socialServer
        self.core = core
        self.server = server
        self.clock = clock
        self.jobs = jobs
    }

    static func start(socialUp: Bool = true, _ configure: (inout MatchmakingConfiguration) -> Void = { _ in }) async throws -> MatchEnv {
        let directory = TemporaryDirectory("matchmaking-tests")
        var accountsConfiguration = AccountsConfiguration(dataDirectory: directory.path + "/accounts")
        accountsConfiguration.passwordParameters = PasswordHasher.Parameters(n: 1024, r: 8, p: 1)
        accountsConfiguration.maxSignUpsPerAddress = 100_000
        let quiet =
            ProcessInfo.processInfo.environment["MATCHMAKING_TEST_LOG"] == "1"
            ? Logger(label: "mm-test") { StreamLogHandler.standardError(label: $0) }
            : Logger(label: "mm-test") { _ in SwiftLogNoOpLogHandler() }
        let accountsCore = try AccountsCore(configuration: accountsConfiguration, logger: quiet)
        let accountsServer = try await TestServer(services: accountsCore.services, keys: accountsCore.signingKeySource, logger: quiet)
        var socialCore: SocialCore?
        var socialServer: TestServer?
        if socialUp {
            let socialPeers = PeerClients { peer in TestServer.peerClient(port: peer == "accounts" ? accountsServer.port : closedPort()) }
            socialCore = try SocialCore(
                configuration: SocialConfiguration(dataDirectory: directory.path + "/social"), peers: socialPeers, logger: quiet)
            socialServer = try await TestServer(services: socialCore!.services, keys: accountsCore.signingKeySource, logger: quiet)
        }
        let ports = ["accounts": accountsServer.port, "social": socialServer?.port ?? closedPort()]
        let peers = PeerClients { peer in TestServer.peerClient(port: ports[peer] ?? closedPort()) }
        var configuration = MatchmakingConfiguration(dataDirectory: directory.path + "/matchmaking")
        configuration.tick = .milliseconds(50)
        configuration.peerDeadline = .seconds(2)
        configure(&configuration)
        let clock = ManualClock()
        let core = try MatchmakingCore(configuration: configuration, peers: peers, clock: clock, logger: quiet)
        let server = try await TestServer(services: core.services, keys: accountsCore.signingKeySource, logger: quiet)
        let delivery = OutboxDelivery(
            database: core.database, retry: OutboxRetryPolicy(initialDelay: .milliseconds(50), maximumDelay: .milliseconds(200)),
            pollInterval: .milliseconds(200), logger: quiet, deliver: OutboxSenders.rpc(peers: peers).deliver)
        let jobs = Task {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await delivery.run() }
                for job in core.backgroundJobs { group.addTask { await job() } }
            }
        }
        return MatchEnv(
            directory: directory, accountsCore: accountsCore, accountsServer: accountsServer, socialCore: socialCore, socialServer: socialServer,
            core: core, server: server, clock: clock, jobs: jobs)
    }

    func stop() async {
        core.shutDownStreams()
        socialCore?.shutDownStreams()
        jobs.cancel()
        await server.stop()
        await socialServer?.stop()
        await accountsServer.stop()
        _ = await jobs.value
        core.close()
        socialCore?.close()
        accountsCore.close()
        directory.remove()
    }

    func player(_ prefix: String = "p") async throws -> Player {
        let name = uniqueName(prefix)
        var r = Accounts_V1_SignUpRequest()
        r.username = name
        r.email = "\(name)@example.com"
        r.password = "correct horse battery staple"
        r.displayName = name.capitalized
        let s = try await accounts.signUp(r)
        return Player(id: s.user.userId, username: name, token: s.session.accessToken)
    }

    func befriend(_ a: Player, _ b: Player) async throws {
        var r = Social_V1_AddFriendRequest()
        var sel = Social_V1_UserSelector()
        sel.username = b.username
        r.user = sel
        _ = try await social.addFriend(r, options: a.options)
    }

    func block(_ a: Player, _ b: Player) async throws {
        var r = Social_V1_BlockUserRequest()
        var sel = Social_V1_UserSelector()
        sel.username = b.username
        r.user = sel
        _ = try await social.blockUser(r, options: a.options)
    }

    /// The notifications social holds for `p` (delivered through matchmaking's outbox).
    func notifications(_ p: Player) async throws -> [Social_V1_Notification] {
        var r = Social_V1_ListNotificationsRequest()
        r.pageSize = 100
        return try await social.listNotifications(r, options: p.options).notifications
    }

    func waitForNotification(_ p: Player, kind: Social_V1_NotificationKind) async throws -> Social_V1_Notification? {
        var found: Social_V1_Notification?
        _ = try await eventually(timeout: .seconds(15)) {
            found = try await self.notifications(p).first { $0.kind == kind }
            return found != nil
        }
        return found
    }

    // MARK: Game helpers

    func challenge(_ from: Player, _ to: Player, rated: Bool = true) async throws -> Matchmaking_V1_Challenge {
        var r = Matchmaking_V1_CreateChallengeRequest()
        r.idempotencyKey = ULID.make()
        r.opponentUsername = to.username
        r.rated = rated
        return try await mm.createChallenge(r, options: from.options).challenge
    }

    /// Two friends and an accepted challenge: (challenger = FIRST, challenged = SECOND, match).
    func friendlyMatch(rated: Bool = true) async throws -> (Player, Player, Matchmaking_V1_Match) {
        let a = try await player("a"), b = try await player("b")
        try await befriend(a, b)
        let c = try await challenge(a, b, rated: rated)
        var accept = Matchmaking_V1_AcceptChallengeRequest()
        accept.challengeId = c.challengeId
        let m = try await mm.acceptChallenge(accept, options: b.options).match
        return (a, b, m)
    }

    func local(_ p: Player, columns: Int32 = 0, rows: Int32 = 0) async throws -> Matchmaking_V1_Match {
        var r = Matchmaking_V1_StartLocalMatchRequest()
        r.idempotencyKey = ULID.make()
        r.columns = columns
        r.rows = rows
        return try await mm.startLocalMatch(r, options: p.options).match
    }

    func getMatch(_ id: String, _ p: Player) async throws -> Matchmaking_V1_Match {
        var r = Matchmaking_V1_GetMatchRequest()
        r.matchId = id
        return try await mm.getMatch(r, options: p.options).match
    }

    /// A legal move for the match's current turn, from the rules engine (steps forward when
    /// `steps` allows, so games end).
    static func legalMove(_ m: Matchmaking_V1_Match, steps: Int = 3) -> Matchmaking_V1_SubmitMoveRequest {
        let state = Self.state(m)
        let dealt = Shape(rawValue: Int(m.nextShape.rawValue))!
        var r = Matchmaking_V1_SubmitMoveRequest()
        r.matchId = m.matchId
        r.turnNumber = m.turnNumber
        var board = state
        if let legal = GameRules.anyLegalPlacementAwayFromAvatars(of: dealt, in: state) {
            var p = Matchmaking_V1_ShapePlacement()
            p.kind = m.nextShape
            var a = Matchmaking_V1_Cell()
            a.column = Int32(legal.anchor.column)
            a.row = Int32(legal.anchor.row)
            p.anchor = a
            p.quarterTurns = Int32(legal.quarterTurns)
            r.placement = p
            let v = try! GameRules.validate(
                MoveInput(placement: .init(kind: dealt.rawValue, anchor: legal.anchor, quarterTurns: legal.quarterTurns), steps: []), dealt: dealt,
                in: state
            ).get()
            board = state.applying(v)
        }
        let seat = state.seatToMove
        var at = board.avatar(seat)
        let other = board.avatar(seat.other)
        let order: [Step] = seat == .first ? [.up, .right, .left] : [.down, .left, .right]
        var last: Step?
        for _ in 0..<steps {
            if at.row == board.goalRow(seat) { break }
            guard
                let s = order.first(where: { s in
                    let n = Point(at.column + s.delta.dc, at.row + s.delta.dr)
                    let back = last.map { ($0 == .left && s == .right) || ($0 == .right && s == .left) } ?? false
                    return !back && board.contains(n) && !board.isBlocked(n) && n != other
                })
            else { break }
            at = Point(at.column + s.delta.dc, at.row + s.delta.dr)
            last = s
            r.steps.append(Matchmaking_V1_Direction(rawValue: Int32(s.rawValue)))
        }
        return r
    }

    static func state(_ m: Matchmaking_V1_Match) -> GameState {
        let b = m.board
        let shapes = b.shapes.map { s in
            PlacedShape(
                shape: Shape(rawValue: Int(s.kind.rawValue))!, anchor: Point(Int(s.anchor.column), Int(s.anchor.row)),
                quarterTurns: Int(s.quarterTurns),
                cells: s.cells.map { Point(Int($0.column), Int($0.row)) }, seat: s.placedBy == .second ? .second : .first, turn: Int(s.turnNumber))
        }
        return GameState(
            columns: Int(b.columns), rows: Int(b.rows), shapes: shapes,
            avatars: [Point(Int(b.firstAvatar.column), Int(b.firstAvatar.row)), Point(Int(b.secondAvatar.column), Int(b.secondAvatar.row))],
            turn: Int(m.turnNumber))
    }

    /// Plays the match to its end with legal moves; returns every move made and the final match.
    func playOut(_ m: Matchmaking_V1_Match, first: Player, second: Player) async throws -> ([Matchmaking_V1_Move], Matchmaking_V1_Match) {
        var match = m
        var moves: [Matchmaking_V1_Move] = []
        while match.status == .active {
            let p = match.seatToMove == .first ? first : second
            let r = try await mm.submitMove(Self.legalMove(match), options: p.options)
            moves.append(r.move)
            match = r.match
        }
        return (moves, match)
    }
}

extension GameRules {
    /// A legal position kept off the avatars' columns where possible (tests play forwards).
    static func anyLegalPlacementAwayFromAvatars(of shape: Shape, in state: GameState) -> (anchor: Point, quarterTurns: Int)? {
        let avoid = Set(state.avatars.map(\.column))
        for q in 0..<4 {
            for r in 0..<state.rows {
                for c in 0..<state.columns {
                    guard let cells = cells(of: shape, anchor: Point(c, r), quarterTurns: q, in: state),
                        cells.allSatisfy({ !avoid.contains($0.column) && abs($0.column - state.avatars[0].column) > 1 }),
                        placementProblem(cells, in: state) == nil
                    else { continue }
                    return (Point(c, r), q)
                }
            }
        }
        return anyLegalPlacement(of: shape, in: state)
    }
}

func withMatchmaking(
    socialUp: Bool = true, _ configure: (inout MatchmakingConfiguration) -> Void = { _ in }, _ body: (MatchEnv) async throws -> Void
) async throws {
    let env = try await MatchEnv.start(socialUp: socialUp, configure)
    do { try await body(env) } catch {
        await env.stop()
        throw error
    }
    await env.stop()
}

/// A stream read in the background: every element is collected.
final class Collector<Element: Sendable>: Sendable {
    let elements = Mutex<[Element]>([])
    let ended = Mutex<RPCError?>(nil)
    let finished = Mutex(false)
    let task = Mutex<Task<Void, Never>?>(nil)

    var all: [Element] { elements.withLock { $0 } }
    var isFinished: Bool { finished.withLock { $0 } }

    func start(_ body: @escaping @Sendable (Collector<Element>) async throws -> Void) {
        let t = Task {
            do { try await body(self) } catch let e as RPCError { self.ended.withLock { $0 = e } } catch {
                self.ended.withLock { $0 = RPCError(.unknown, "\(error)") }
            }
            self.finished.withLock { $0 = true }
        }
        task.withLock { $0 = t }
    }

    func append(_ e: Element) { elements.withLock { $0.append(e) } }

    @discardableResult
    func waitFor(timeout: Duration = .seconds(15), _ condition: @escaping @Sendable ([Element]) -> Bool) async -> Bool {
        await eventually(timeout: timeout) { condition(self.all) }
    }

    func cancel() async {
        let t = task.withLock { $0 }
        t?.cancel()
        await t?.value
    }

    func waitUntilFinished(timeout: Duration = .seconds(15)) async -> RPCError? {
        _ = await eventually(timeout: timeout) { self.isFinished }
        return ended.withLock { $0 }
    }
}

extension MatchEnv {
    func watch(_ matchID: String, _ p: Player, after: Int64 = 0) -> Collector<Matchmaking_V1_WatchMatchResponse> {
        let c = Collector<Matchmaking_V1_WatchMatchResponse>()
        var request = Matchmaking_V1_WatchMatchRequest()
        request.matchId = matchID
        request.afterSequence = after
        let r = request
        let client = mm
        c.start { c in
            try await client.watchMatch(r, options: p.options(timeout: .seconds(120))) { stream in
                for try await e in stream.messages { c.append(e) }
            }
        }
        return c
    }

    func joinQueue(_ p: Player) -> Collector<Matchmaking_V1_JoinQueueResponse> {
        let c = Collector<Matchmaking_V1_JoinQueueResponse>()
        let client = mm
        c.start { c in
            try await client.joinQueue(Matchmaking_V1_JoinQueueRequest(), options: p.options(timeout: .seconds(120))) { stream in
                for try await e in stream.messages { c.append(e) }
            }
        }
        return c
    }
}
