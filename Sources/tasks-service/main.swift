import ArgumentParser
import Contracts
import Foundation
import Logging
import RPCCore
import RPCTransport
import ServiceKit
import Tasks

/// `tasks-service [run] [--host H] [--port 9102] [--data-dir ./data/tasks]`: team tasks and household
/// chores (tasks.v1.Tasks, tasks.v1.TasksInternal), with health and reflection. Settings beyond the
/// shared flags come from environment variables (Sources/Tasks/README.md).
///
/// `tasks-service --verify-journal` asks the running service at `--host`/`--port` (or
/// `TASKS_ADDR`) to verify the team-task journal, prints what it found and exits 0 when intact,
/// 1 when a link is broken (named), 2 when the service cannot be asked.
///
/// `tasks-service backup --data-dir DIR --to FILE` copies its database while it runs, and
/// `tasks-service restore --data-dir DIR --from FILE` puts a backup back while it is stopped
/// (ServiceKit's `BackupCommand`/`RestoreCommand`; docs/operations.md, "Backups").
@main
struct TasksServiceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tasks-service",
        abstract: "The tasks service: team tasks, attachments and public links, household chores, the marketplace, habits (gRPC).",
        subcommands: [Run.self, BackupCommand<TasksSchema>.self, RestoreCommand<TasksSchema>.self], defaultSubcommand: Run.self)
}

extension TasksServiceCommand {
    /// Serving: the default subcommand, so `tasks-service --port N` works as it always did.
    struct Run: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "run", abstract: "Serve (the default).")

        @OptionGroup var options: ServiceOptions
        @Flag(name: .customLong("verify-journal"), help: "Verify the running service's team-task journal and exit (0 intact, 1 broken).")
        var verifyJournal = false

        func run() async throws {
            let settings = try ServiceSettings(name: "tasks", options: options)
            ServiceHost.bootstrapLogging(settings)
            let logger = Logger(label: "tasks")
            if verifyJournal { throw ExitCode(await Self.verify(settings: settings)) }
            let configuration = try TasksConfiguration.from(settings.settings, dataDirectory: settings.dataDir)
            let peers = PeerClients(settings: settings)
            let core = try TasksCore(configuration: configuration, peers: peers, logger: logger)
            defer { core.close() }
            try await ServiceHost.run(
                settings: settings, services: core.services, descriptors: ContractsDescriptors.descriptorSet,
                keys: RemoteSigningKeys(client: peers.client("accounts"), logger: logger), logger: logger,
                background: core.backgroundJobs, outbox: .init(database: core.database), peers: peers
            ) { server in
                // Attachments: the 5 MiB UploadTeamTaskAttachment (each method's own limit applies below).
                server.maxReceiveMessageSize = configuration.maxRequestBytes
            }
        }

        /// The operator's check of the journal: one VerifyJournal call with the service credential.
        static func verify(settings: ServiceSettings) async -> Int32 {
            let host = settings.host == "0.0.0.0" ? "127.0.0.1" : settings.host
            let channel = RPCChannel(
                configuration: settings.peerChannelConfiguration(host: host, port: settings.port, serverName: settings.peerTLSServerName("tasks")))
            defer { Task { await channel.close() } }
            let client = Tasks_V1_TasksInternalClient(RPCClient(transport: CredentialedTransport(base: channel, serviceToken: settings.serviceToken)))
            do {
                let r = try await client.verifyJournal(Tasks_V1_VerifyJournalRequest(), options: CallOptions(timeout: .seconds(600)))
                if r.intact {
                    print("journal intact: \(r.checkedEntries) entries, head \(r.headHash.isEmpty ? "(empty journal)" : r.headHash)")
                    if r.erasedValues > 0 { print("\(r.erasedValues) personal values erased (their commitments verified)") }
                    return 0
                }
                print(
                    "journal BROKEN at entry \(r.firstBrokenSequence)\(r.firstBrokenEntryId.isEmpty ? "" : " (\(r.firstBrokenEntryId))"): \(r.problem)"
                )
                print("\(r.checkedEntries) entries checked")
                return 1
            } catch {
                print("cannot ask tasks-service at \(host):\(settings.port): \(error)")
                return 2
            }
        }
    }
}
