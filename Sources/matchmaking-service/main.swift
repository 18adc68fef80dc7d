import ArgumentParser
import Contracts
import Logging
import Matchmaking
import ServiceKit

/// `matchmaking-service [run] [--host H] [--port 9105] [--data-dir ./data/matchmaking]`: the board game,
/// the random queue, ratings and the leaderboard (matchmaking.v1.Matchmaking and
/// MatchmakingInternal), with health and reflection. Settings beyond the shared flags come from
/// environment variables (Sources/Matchmaking/README.md); peers from `ACCOUNTS_ADDR` and
/// `SOCIAL_ADDR`.
///
/// `matchmaking-service backup --data-dir DIR --to FILE` copies its database while it runs, and
/// `matchmaking-service restore --data-dir DIR --from FILE` puts a backup back while it is stopped
/// (ServiceKit's `BackupCommand`/`RestoreCommand`; docs/operations.md, "Backups").
@main
struct MatchmakingServiceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "matchmaking-service",
        abstract: "The matchmaking service: the board game, the queue, ratings and the leaderboard (gRPC).",
        subcommands: [Run.self, BackupCommand<MatchmakingSchema>.self, RestoreCommand<MatchmakingSchema>.self], defaultSubcommand: Run.self)
}

extension MatchmakingServiceCommand {
    /// Serving: the default subcommand, so `matchmaking-service --port N` works as it always did.
    struct Run: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "run", abstract: "Serve (the default).")

        @OptionGroup var options: ServiceOptions

        func run() async throws {
            let settings = try ServiceSettings(name: "matchmaking", options: options)
            ServiceHost.bootstrapLogging(settings)
            let logger = Logger(label: "matchmaking")
            let peers = PeerClients(settings: settings)
            let core = try MatchmakingCore(
                configuration: .from(settings.settings, dataDirectory: settings.dataDir), peers: peers, logger: logger)
            defer { core.close() }
            try await ServiceHost.run(
                settings: settings, services: core.services, descriptors: ContractsDescriptors.descriptorSet,
                keys: RemoteSigningKeys(client: peers.client("accounts"), logger: logger),
                logger: logger, background: core.backgroundJobs,
                outbox: .init(database: core.database), peers: peers,
                configure: { config in
                    // A queued client that vanished without closing is found by PING within 15 s.
                    config.keepaliveTime = .seconds(10)
                    config.keepaliveTimeout = .seconds(5)
                },
                beforeDrain: { core.shutDownStreams() })
        }
    }
}
