import RPCCore

/// One RPC with the Swift types of its request and response messages, so tools that only know a
/// fixture's message name can decode and send it with the generated code.
public struct ContractRPC: Sendable {
    public let descriptor: MethodDescriptor
    public let requestType: any ProtoMessage.Type
    public let responseType: any ProtoMessage.Type

    public init(_ descriptor: MethodDescriptor, _ requestType: any ProtoMessage.Type, _ responseType: any ProtoMessage.Type) {
        self.descriptor = descriptor
        self.requestType = requestType
        self.responseType = responseType
    }
}

/// Every service's RPCs, keyed by the directory name used under `Proto/` and `Tests/Fixtures/`
/// (`accounts`, `tasks`, …). A service directory holds the public service and its `*Internal`
/// twin; method names are unique across the two, which is why a fixture is named by method only.
public enum ContractCatalog {
    public struct Service: Sendable {
        /// `accounts`: `Proto/accounts/`, `Tests/Fixtures/accounts/`.
        public let directory: String
        /// The generated method tables (`…Methods.all` of the public and the Internal service).
        public let methods: [MethodDescriptor]
        /// The hand-written type table (`ContractCatalog+<Service>.swift`).
        public let rpcs: [ContractRPC]

        /// The RPC named `method` in the public or the Internal service.
        public func rpc(method: String) -> ContractRPC? {
            rpcs.first { $0.descriptor.method == method }
        }

        /// Request and response types by full protobuf name.
        public var messageTypes: [String: any ProtoMessage.Type] {
            var types: [String: any ProtoMessage.Type] = [:]
            for r in rpcs {
                types[r.requestType.protoMessageName] = r.requestType
                types[r.responseType.protoMessageName] = r.responseType
            }
            return types
        }
    }

    public static let services: [Service] = [accounts, finance, matchmaking, social, tasks]

    public static func service(_ directory: String) -> Service? {
        services.first { $0.directory == directory }
    }
}
