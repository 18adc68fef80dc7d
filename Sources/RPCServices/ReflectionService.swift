import GRPCContracts
import RPCCore
import RPCProtobuf

/// `grpc.reflection.v1.ServerReflection`.
public struct ReflectionServiceV1: Grpc_Reflection_V1_ServerReflectionService {
    public let index: ReflectionIndex
    public init(index: ReflectionIndex) { self.index = index }

    public func serverReflectionInfo(
        requests: MessageStream<Grpc_Reflection_V1_ServerReflectionRequest>,
        responses: ResponseWriter<Grpc_Reflection_V1_ServerReflectionResponse>,
        context: ServerContext
    ) async throws {
        for try await request in requests {
            let answer: ReflectionIndex.Answer =
                switch request.messageRequest {
                case .fileByFilename(let name): index.fileByName(name)
                case .fileContainingSymbol(let symbol): index.fileContainingSymbol(symbol)
                case .fileContainingExtension(let ext): index.fileContainingExtension(type: ext.containingType, number: ext.extensionNumber)
                case .allExtensionNumbersOfType(let type): index.extensionNumbers(of: type)
                case .listServices: index.listServices
                case nil: .error(code: 3, message: "empty reflection request")
                }
            var response = Grpc_Reflection_V1_ServerReflectionResponse()
            response.validHost = request.host
            response.originalRequest = request
            switch answer {
            case .files(let files):
                var r = Grpc_Reflection_V1_FileDescriptorResponse()
                r.fileDescriptorProto = files
                response.messageResponse = .fileDescriptorResponse(r)
            case .services(let names):
                var r = Grpc_Reflection_V1_ListServiceResponse()
                r.service = names.map {
                    var s = Grpc_Reflection_V1_ServiceResponse(); s.name = $0; return s
                }
                response.messageResponse = .listServicesResponse(r)
            case .extensionNumbers(let type, let numbers):
                var r = Grpc_Reflection_V1_ExtensionNumberResponse()
                r.baseTypeName = type
                r.extensionNumber = numbers
                response.messageResponse = .allExtensionNumbersResponse(r)
            case .error(let code, let message):
                var r = Grpc_Reflection_V1_ErrorResponse()
                r.errorCode = code
                r.errorMessage = message
                response.messageResponse = .errorResponse(r)
            }
            try await responses.write(response)
        }
    }
}

/// `grpc.reflection.v1alpha.ServerReflection` (same protocol, older package; grpcurl and many
/// tools still ask for it first). Its messages are the v1 messages under another package, field
/// for field, so the v1 handler serves it byte for byte.
public struct ReflectionServiceV1Alpha: RPCService {
    public let index: ReflectionIndex
    public init(index: ReflectionIndex) { self.index = index }

    public var serviceName: String { Grpc_Reflection_V1alpha_ServerReflectionMethods.serviceName }
    public var methods: [ServerMethod] {
        [
            ServerMethod(
                Grpc_Reflection_V1alpha_ServerReflectionMethods.serverReflectionInfo,
                ReflectionServiceV1(index: index).methods[0].handler)
        ]
    }
}

/// The standard services every process serves, for the services it registers.
public enum StandardServices {
    /// Health (every service SERVING) plus reflection v1 and v1alpha listing `services` and the
    /// standard ones, answering from `descriptors`.
    public static func make(
        for services: [any RPCService], descriptors: ProtoDescriptorSet
    )
        -> (health: HealthService, all: [any RPCService])
    {
        let names = services.map(\.serviceName)
        let health = HealthService(services: names + [Grpc_Health_V1_HealthMethods.serviceName])
        let index = ReflectionIndex(descriptors: descriptors.merging(GRPCContractsDescriptors.descriptorSet), services: names + standardNames)
        return (health, services + [health] + reflection(index: index))
    }

    /// Health and the two reflection services: what reflection lists besides a process's own.
    public static let standardNames = [
        Grpc_Health_V1_HealthMethods.serviceName, Grpc_Reflection_V1_ServerReflectionMethods.serviceName,
        Grpc_Reflection_V1alpha_ServerReflectionMethods.serviceName,
    ]

    /// Reflection v1 and v1alpha answering from `index`.
    public static func reflection(index: ReflectionIndex) -> [any RPCService] {
        [ReflectionServiceV1(index: index), ReflectionServiceV1Alpha(index: index)]
    }
}
