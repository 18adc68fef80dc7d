// swift-tools-version: 6.1
import PackageDescription

/// Warnings are errors in CI (`CI=true`), so the tree stays clean without slowing local work.
/// Release builds skip the runtime exclusivity checks (debug builds, which the tests use, keep
/// them): on the request path they cost about 3% of the CPU (swift_beginAccess per class field).
/// `scripts/swift-release` and the container image skip them in the dependencies too (SwiftNIO's
/// event loop makes ≈ 60 checks a wakeup).
let strict: [SwiftSetting] = (Context.environment["CI"] == "true" ? [.unsafeFlags(["-warnings-as-errors"])] : [])
    + [.unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release))]

let package = Package(
    name: "Backend",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "interop-server", targets: ["interop-server"]),
        .executable(name: "health-probe", targets: ["health-probe"]),
        .executable(name: "dev-certs", targets: ["dev-certs"]),
        .executable(name: "interop-client", targets: ["interop-client"]),
        .executable(name: "protoc-gen-swiftpbc", targets: ["protoc-gen-swiftpbc"]),
        .executable(name: "accounts-service", targets: ["accounts-service"]),
        .executable(name: "matchmaking-service", targets: ["matchmaking-service"]),
        .executable(name: "social-service", targets: ["social-service"]),
        .executable(name: "gateway", targets: ["gateway"]),
        .executable(name: "finance-service", targets: ["finance-service"]),
        .executable(name: "tasks-service", targets: ["tasks-service"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-configuration.git", from: "1.4.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.3.0"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
    ],
    targets: [
        // System libraries: [system] modulemap + shim.h, apt providers named.
        .systemLibrary(name: "CNGHTTP2", providers: [.apt(["libnghttp2-dev"])]),
        .systemLibrary(name: "CProtobufC", providers: [.apt(["libprotobuf-c-dev"])]),
        .systemLibrary(name: "COpenSSL", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CSQLite", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CZlib", providers: [.apt(["zlib1g-dev"])]),

        // nghttp2's allocator: per-thread free lists by size class (C: an allocator's fast path
        // must not retain, check exclusivity or go through value witnesses).
        .target(name: "CNGHTTP2Memory", dependencies: ["CNGHTTP2"]),

        // The runtime: no C in RPCCore; the transport owns nghttp2, OpenSSL and zlib.
        .target(name: "RPCCore", swiftSettings: strict),
        .target(
            name: "RPCTransport",
            dependencies: [
                "RPCCore", "RPCTLS", "CNGHTTP2", "CNGHTTP2Memory", "COpenSSL", "CZlib",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),

        // TLS over OpenSSL as a NIO channel handler (memory BIOs; no C types in its API).
        .target(
            name: "RPCTLS",
            dependencies: [
                "COpenSSL",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),

        // Contracts: protoc-c output (C) and our generated Swift, all committed.
        .target(name: "ContractsC", dependencies: ["CProtobufC"], linkerSettings: [.linkedLibrary("protobuf-c")]),
        .target(name: "RPCProtobuf", dependencies: ["RPCCore", "CProtobufC"], swiftSettings: strict),
        .target(name: "GRPCContracts", dependencies: ["RPCCore", "RPCProtobuf", "ContractsC"], swiftSettings: strict),
        // Our own contracts (Proto/); the well-known types' Swift lives in GRPCContracts, imported.
        .target(
            name: "Contracts", dependencies: ["RPCCore", "RPCProtobuf", "ContractsC", "GRPCContracts"],
            swiftSettings: strict),
        // OpenTelemetry's OTLP (Proto/opentelemetry, vendored): generated apart from our contracts,
        // so that no process serves, reflects or routes its service.
        .target(name: "OTLPContracts", dependencies: ["RPCCore", "RPCProtobuf", "ContractsC"], swiftSettings: strict),
        .executableTarget(name: "protoc-gen-swiftpbc", dependencies: ["ContractsC", "CProtobufC"], swiftSettings: strict),
        // Contract testing (docs/contracts.md): fixtures through protoc, the live-service harness.
        .target(
            name: "ContractTesting", dependencies: ["RPCCore", "RPCTransport", "Contracts"], swiftSettings: strict),

        // Standard services every process serves.
        .target(name: "RPCServices", dependencies: ["RPCCore", "RPCProtobuf", "GRPCContracts"], swiftSettings: strict),

        // Storage (SQLite per service) and Security (OpenSSL crypto): no C types in their APIs.
        .target(
            name: "Storage",
            dependencies: [
                "CSQLite", "RPCCore", "Observability", .product(name: "Logging", package: "swift-log"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            swiftSettings: strict
        ),
        // Metrics (swift-metrics facade, Prometheus registry), call observation, /metrics; traces
        // (our W3C tracer behind swift-distributed-tracing's API, the span file exporter).
        .target(
            name: "Observability",
            dependencies: [
                "RPCCore",
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // The OTLP/gRPC span exporter (`TRACE_EXPORT=otlp://`, `otlps://`): Observability's
        // `SpanExporter` over our own client runtime and the generated OTLP types.
        .target(
            name: "OTLPExport",
            dependencies: [
                "Observability", "OTLPContracts", "RPCCore", "RPCTransport", "RPCTLS", "RPCProtobuf",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: strict
        ),
        .target(name: "Security", dependencies: ["COpenSSL"], swiftSettings: strict),
        // Push providers (APNs, FCM HTTP v1, Web Push) over async-http-client: only social links it.
        .target(
            name: "Push",
            dependencies: [
                "Security",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "storage-crash-helper",
            dependencies: ["Storage", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict
        ),

        // The service kit: what every service process shares (docs/architecture.md, "A new
        // service"): settings, lifecycle, the access policy and token keys, ids and clock, field
        // rules, page tokens, throttles, the blocking pool, storage-error mapping, idempotency,
        // the outbox's peer senders and the EraseUser receiver.
        .target(
            name: "ServiceKit",
            dependencies: [
                "RPCCore", "RPCTransport", "RPCTLS", "RPCServices", "RPCProtobuf", "Contracts", "GRPCContracts", "Security",
                "Storage", "Observability", "OTLPExport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),

        // grpc.health.v1 Check from the command line (scripts/run, compose health checks).
        .executableTarget(
            name: "health-probe",
            dependencies: [
                "RPCCore", "RPCTransport", "RPCTLS", "GRPCContracts",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict
        ),

        // A development cluster CA and the certificates it signs (scripts/run INTERNAL_TLS=1, compose).
        .executableTarget(
            name: "dev-certs",
            dependencies: ["RPCTLS", .product(name: "ArgumentParser", package: "swift-argument-parser")],
            swiftSettings: strict
        ),

        // The gRPC interop TestService and our client's interop cases.
        .target(name: "Interop", dependencies: ["RPCCore", "GRPCContracts"], swiftSettings: strict),
        .executableTarget(
            name: "interop-server",
            dependencies: [
                "Interop", "RPCCore", "RPCTransport", "RPCTLS", "RPCServices", "GRPCContracts",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "interop-client",
            dependencies: [
                "Interop", "RPCCore", "RPCTransport", "RPCTLS", "GRPCContracts",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict
        ),

        // accounts: identity, sessions, profiles. Library (rules, store, handlers) + thin executable.
        .target(
            name: "Accounts",
            dependencies: [
                "Storage", "Security", "ServiceKit", "Contracts", "GRPCContracts", "RPCCore", "RPCProtobuf",
                .product(name: "Logging", package: "swift-log"),
            ],
            exclude: ["README.md"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "accounts-service",
            dependencies: [
                "Accounts", "ServiceKit", "Contracts", "RPCTransport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),

        // social: teams, households, friends, follows, notifications. Library + thin executable.
        .target(
            name: "Social",
            dependencies: [
                "Storage", "Security", "Push", "ServiceKit", "Contracts", "GRPCContracts", "RPCCore", "RPCProtobuf",
                .product(name: "Logging", package: "swift-log"),
            ],
            exclude: ["README.md"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "social-service",
            dependencies: [
                "Social", "ServiceKit", "Contracts", "RPCTransport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),

        // finance: household money and marketplace settlements. Library (rules, ledger, handlers)
        // + thin executable.
        .target(
            name: "Finance",
            dependencies: [
                "Storage", "Security", "ServiceKit", "Contracts", "GRPCContracts", "RPCCore", "RPCProtobuf",
                .product(name: "Logging", package: "swift-log"),
            ],
            exclude: ["README.md"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "finance-service",
            dependencies: [
                "Finance", "ServiceKit", "Contracts", "RPCTransport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),

        // tasks: team tasks and chores (marketplace and habits next), one part per area over one
        // database. Library (rules, store, handlers) + thin executable.
        .target(
            name: "Tasks",
            dependencies: [
                "Storage", "Security", "ServiceKit", "Contracts", "GRPCContracts", "RPCCore", "RPCProtobuf",
                .product(name: "Logging", package: "swift-log"),
            ],
            exclude: ["README.md"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "tasks-service",
            dependencies: [
                "Tasks", "ServiceKit", "Contracts", "RPCTransport", "RPCCore",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),

        // matchmaking: the board game, the queue, ratings and the leaderboard. Library + thin executable.
        .target(
            name: "Matchmaking",
            dependencies: [
                "Storage", "Security", "ServiceKit", "Contracts", "GRPCContracts", "RPCCore", "RPCProtobuf",
                .product(name: "Logging", package: "swift-log"),
            ],
            exclude: ["README.md"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "matchmaking-service",
            dependencies: [
                "Matchmaking", "ServiceKit", "Contracts", "RPCTransport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // The reminder rows of scripts/bench (tasks' due scan in-process, on a real database).
        .executableTarget(
            name: "tasks-bench",
            dependencies: ["Tasks", "ServiceKit", "Storage", "RPCTransport", .product(name: "Logging", package: "swift-log")],
            path: "Sources/tasks-bench",
            swiftSettings: strict
        ),
        // The matchmaking rows of scripts/bench (the matchmaker and the rules engine in-process).
        .executableTarget(
            name: "matchmaking-bench",
            dependencies: ["Matchmaking", "ServiceKit", "Contracts", "RPCCore", "RPCTransport"],
            path: "Sources/matchmaking-bench",
            swiftSettings: strict
        ),

        // gateway: the public API (gRPC proxy, auth and limits, Connect JSON). Library + thin executable.
        .target(
            name: "Gateway",
            dependencies: [
                "RPCCore", "RPCTransport", "RPCTLS", "RPCServices", "RPCProtobuf", "Contracts", "GRPCContracts",
                "ServiceKit", "Security", "Observability",
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "gateway",
            dependencies: [
                "Gateway", "ServiceKit", "RPCTransport", "Observability",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),

        .testTarget(name: "RPCCoreTests", dependencies: ["RPCCore"]),
        // Codec tests: fixtures generated from Tests/ProtobufTests/Proto, and the leak check
        // (scripts/leakcheck runs protobuf-leakcheck under valgrind).
        .target(name: "ProtobufTestsC", dependencies: ["ContractsC"], path: "Tests/ProtobufTests/Fixtures/C"),
        .target(
            name: "ProtobufTestContracts",
            dependencies: ["RPCCore", "RPCProtobuf", "GRPCContracts", "ContractsC", "ProtobufTestsC"],
            path: "Tests/ProtobufTests/Fixtures/Swift", swiftSettings: strict),
        .executableTarget(
            name: "protobuf-leakcheck",
            dependencies: ["RPCCore", "RPCProtobuf", "GRPCContracts", "ProtobufTestContracts"],
            path: "Tests/ProtobufTests/LeakCheck", swiftSettings: strict),
        .testTarget(
            name: "ProtobufTests",
            dependencies: ["RPCCore", "RPCProtobuf", "GRPCContracts", "Contracts", "ProtobufTestContracts", "ContractTesting"],
            exclude: ["Fixtures", "LeakCheck", "Proto"]),
        .testTarget(name: "StorageTests", dependencies: ["Storage", "RPCCore", "Observability", "storage-crash-helper"]),
        .testTarget(name: "SecurityTests", dependencies: ["Security"]),
        // Test support every service's tests share (token keys, an in-process server behind the
        // kit's policy, failure details). For test targets only.
        .target(
            name: "ServiceKitTesting",
            dependencies: ["ServiceKit", "Observability", "Security", "Contracts", "RPCCore", "RPCTransport", "RPCServices", "RPCTLS",
                           .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict
        ),
        // Test-only infrastructure: any subset of the real services in one process, wired to each
        // other over loopback gRPC (docs/architecture.md, "Testing"). For test targets only; no
        // service depends on it, and no service imports another.
        .target(
            name: "ServiceCluster",
            dependencies: [
                "ServiceKitTesting", "ServiceKit", "Accounts", "Social", "Finance", "Tasks", "ContractTesting", "Security", "Storage", "Contracts",
                "RPCCore", "RPCTransport", .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ServiceKitTests",
            dependencies: [
                "ServiceKit", "ServiceKitTesting", "Storage", "Security", "Contracts", "GRPCContracts", "RPCCore", "RPCTransport",
                "RPCServices", "RPCTLS", "Observability", "OTLPExport", "OTLPContracts", .product(name: "Logging", package: "swift-log"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .testTarget(
            name: "TLSTests",
            dependencies: [
                "RPCTLS",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "AccountsTests",
            dependencies: [
                "Accounts", "accounts-service", "Storage", "Security", "ServiceKit", "Contracts", "GRPCContracts",
                "RPCCore", "RPCTransport", "RPCServices", "RPCProtobuf", "ContractTesting", "Observability",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "MatchmakingTests",
            dependencies: [
                "Matchmaking", "matchmaking-service", "Social", "social-service", "Accounts", "accounts-service", "ServiceKit",
                "ServiceKitTesting", "Storage", "Security", "Contracts", "GRPCContracts", "RPCCore", "RPCTransport", "RPCServices",
                "RPCProtobuf", "ContractTesting", "ServiceCluster",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "SocialTests",
            dependencies: [
                "Social", "Push", "social-service", "Tasks", "Accounts", "accounts-service", "health-probe", "ServiceKit", "ServiceKitTesting", "ServiceCluster",
                "Storage", "Security", "Contracts", "GRPCContracts", "RPCCore", "RPCTransport", "RPCServices", "RPCProtobuf", "RPCTLS", "ContractTesting",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ]
        ),
        .testTarget(
            name: "FinanceTests",
            dependencies: [
                "Finance", "finance-service", "Social", "social-service", "tasks-service", "matchmaking-service", "Accounts", "ServiceKit", "ServiceKitTesting", "ServiceCluster", "Storage", "Security", "Contracts",
                "GRPCContracts", "RPCCore", "RPCTransport", "RPCServices", "RPCProtobuf", "ContractTesting",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "TasksTests",
            dependencies: [
                "Tasks", "tasks-service", "Social", "Accounts", "ServiceKit", "ServiceKitTesting", "ServiceCluster", "Storage", "Security", "Contracts",
                "GRPCContracts", "RPCCore", "RPCTransport", "RPCServices", "RPCProtobuf", "ContractTesting",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "GatewayTests",
            dependencies: [
                "Gateway", "Accounts", "ServiceKit", "ServiceKitTesting", "Security", "Contracts", "GRPCContracts", "RPCCore", "RPCTransport",
                "RPCServices", "RPCTLS", "ProtobufTestContracts", "Observability", .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .testTarget(name: "RPCTransportTests", dependencies: ["RPCCore", "RPCTransport", "RPCTLS", "RPCServices", "GRPCContracts", "Interop"]),
        // Every fixture against protoc and our codec; the harness against an in-process server.
        .testTarget(name: "ContractTests", dependencies: ["Contracts", "RPCCore", "RPCTransport", "ContractTesting"]),
    ]
)
