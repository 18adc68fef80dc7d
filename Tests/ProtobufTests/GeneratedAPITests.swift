import Contracts
import GRPCContracts
import ProtobufTestContracts
import RPCCore
import RPCProtobuf
import Testing

/// The generated service tables, protocols and descriptor sets.
@Suite struct GeneratedAPITests {
    @Test func methodTablesCarryKindsVisibilityAndTypes() {
        typealias M = Codectest_V1_CodecTestServiceMethods
        #expect(M.serviceName == "codectest.v1.CodecTestService")
        #expect(M.unary.path == "/codectest.v1.CodecTestService/Unary")
        #expect(M.unary.kind == .unary)
        #expect(M.unary.visibility == .publicAnonymous)
        #expect(M.unary.inputType == "codectest.v1.Scalars")
        #expect(M.serverStream.kind == .serverStreaming)
        #expect(M.serverStream.visibility == .publicAuthenticated)
        #expect(M.clientStream.kind == .clientStreaming)
        #expect(M.clientStream.visibility == .internal)
        #expect(M.clientStream.outputType == "codectest.v1.Everything")
        #expect(M.bidi.kind == .bidirectionalStreaming)
        #expect(M.bidi.visibility == .internal)  // no option: internal
        #expect(M.import.method == "Import")
        #expect(M.all.map(\.method) == ["Unary", "ServerStream", "ClientStream", "Bidi", "Import"])

        #expect(Grpc_Testing_TestServiceMethods.streamingInputCall.kind == .clientStreaming)
        #expect(Grpc_Testing_TestServiceMethods.fullDuplexCall.kind == .bidirectionalStreaming)
        #expect(Grpc_Health_V1_HealthMethods.watch.kind == .serverStreaming)
        #expect(Grpc_Reflection_V1_ServerReflectionMethods.serverReflectionInfo.kind == .bidirectionalStreaming)
    }

    struct Impl: Codectest_V1_CodecTestService {
        func unary(request: Codectest_V1_Scalars, context: ServerContext) async throws -> Codectest_V1_Scalars { request }
        func serverStream(request: Codectest_V1_Nested, responses: ResponseWriter<Codectest_V1_Nested>, context: ServerContext) async throws {
            try await responses.write(request)
        }
        func clientStream(requests: MessageStream<Codectest_V1_Choice>, context: ServerContext) async throws -> Codectest_V1_Everything {
            var e = Codectest_V1_Everything()
            for try await c in requests { e.choices.append(c) }
            return e
        }
        func bidi(requests: MessageStream<Codectest_V1_Tree>, responses: ResponseWriter<Codectest_V1_Tree>, context: ServerContext) async throws {
            for try await t in requests { try await responses.write(t) }
        }
        func `import`(request: Codectest_V1_Empty, context: ServerContext) async throws -> Codectest_V1_Empty { request }
    }

    @Test func serviceProtocolBuildsRoutableMethods() async throws {
        let service = Impl()
        #expect(service.serviceName == "codectest.v1.CodecTestService")
        #expect(service.methods.map(\.descriptor) == Codectest_V1_CodecTestServiceMethods.all)
        #expect(service.methods.map(\.handler.kind) == [.unary, .serverStreaming, .clientStreaming, .bidirectionalStreaming, .unary])
        let router = Router(services: [service])
        guard case .success(let m) = router.lookup("/codectest.v1.CodecTestService/Unary"), case .unary(let handler) = m.handler else {
            Issue.record("Unary not routed")
            return
        }
        let context = ServerContext(method: m.descriptor, requestMetadata: Metadata(), deadline: nil, peer: "test")
        let request = CodecSamples.scalars()
        let response = try await handler(request.serializedBytes(), context)
        #expect(try Codectest_V1_Scalars(serializedBytes: response) == request)
    }

    @Test func descriptorSetsCoverFilesDependenciesAndSymbols() throws {
        let set = ProtobufTestContractsDescriptors.descriptorSet
        let file = "codectest/v1/codec_test.proto"
        #expect(ProtobufTestContractsDescriptors.generatedFiles == [file])
        #expect(set.services == ["codectest.v1.CodecTestService"])
        #expect(set.dependencies[file] == ["common/v1/options.proto", "google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"])
        #expect(set.file(containingSymbol: "codectest.v1.CodecTestService") == file)
        #expect(set.file(containingSymbol: "codectest.v1.CodecTestService.Bidi") == file)
        #expect(set.file(containingSymbol: "codectest.v1.Nested.Deep") == file)
        #expect(set.file(containingSymbol: "codectest.v1.Nested.Level") == file)
        #expect(set.file(containingSymbol: "codectest.v1.Scalars.f_int32") == file)  // a field: its message's file
        #expect(set.file(containingSymbol: "google.protobuf.Timestamp") == "google/protobuf/timestamp.proto")
        #expect(set.file(containingSymbol: "common.v1.access") == "common/v1/options.proto")
        #expect(set.file(containingSymbol: "google.protobuf.MethodOptions") == "google/protobuf/descriptor.proto")
        #expect(set.file(containingSymbol: "nope.Nothing") == nil)
        #expect(
            set.fileWithDependencies(file) == [
                file, "common/v1/options.proto", "google/protobuf/descriptor.proto", "google/protobuf/timestamp.proto",
                "google/protobuf/wrappers.proto",
            ])

        // The embedded bytes are the FileDescriptorProto protoc itself produces (less json_name).
        let bytes = try #require(set.files[file])
        let ours = try Protoc.decode("google.protobuf.FileDescriptorProto", bytes, file: "common/v1/options.proto")
        #expect(ours.contains(#"name: "codectest/v1/codec_test.proto""#))
        #expect(ours.contains("[common.v1.access]: ACCESS_PUBLIC"))
        #expect(ours.contains("server_streaming: true"))
        #expect(!ours.contains("source_code_info"))
    }

    @Test func moduleDescriptorSetsMerge() {
        let grpc = GRPCContractsDescriptors.descriptorSet
        #expect(grpc.services.contains("grpc.health.v1.Health"))
        #expect(grpc.services.contains("grpc.reflection.v1.ServerReflection"))
        #expect(grpc.services.contains("grpc.reflection.v1alpha.ServerReflection"))
        #expect(grpc.services.contains("grpc.testing.TestService"))
        #expect(grpc.file(containingSymbol: "grpc.testing.Empty") == "grpc/testing/empty.proto")
        #expect(
            grpc.fileWithDependencies("grpc/testing/test.proto") == [
                "grpc/testing/test.proto", "grpc/testing/empty.proto", "grpc/testing/messages.proto",
            ])
        let merged = grpc.merging(ContractsDescriptors.descriptorSet)
        #expect(merged.files["grpc/health/v1/health.proto"] != nil)
        #expect(merged.files["common/v1/types.proto"] != nil)
        #expect(merged.file(containingSymbol: "common.v1.Money") == "common/v1/types.proto")
    }

    @Test func contractsRoundTrip() throws {
        var money = Common_V1_Money()
        money.amountCents = -1234
        money.currency = "EUR"
        #expect(try Common_V1_Money(serializedBytes: money.serializedBytes()) == money)
        let reference = try Protoc.encode("common.v1.Money", #"amount_cents: -1234 currency: "EUR""#, file: "common/v1/types.proto")
        #expect(money.serializedBytes() == reference)
        #expect(Common_V1_Access.public.rawValue == 1)
    }
}

@Suite struct BuilderTests {
    @Test func withBuildsInOneExpression() {
        let r = Grpc_Health_V1_HealthCheckRequest.with { $0.service = "a.v1.A" }
        #expect(r.service == "a.v1.A")
    }
}
