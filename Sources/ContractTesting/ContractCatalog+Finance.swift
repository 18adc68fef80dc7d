import Contracts
import RPCCore

// Maintained by hand (the generator emits no message registry): every RPC of finance.v1.Finance and
// finance.v1.FinanceInternal with its Swift request and response types. ContractTests checks that
// this table lists exactly the methods of Finance_V1_FinanceMethods.all and
// Finance_V1_FinanceInternalMethods.all and that each type's protoMessageName matches the
// descriptor, so a new RPC fails the tests until its line is added here.
extension ContractCatalog {
    static let finance = ContractCatalog.Service(
        directory: "finance",
        methods: Finance_V1_FinanceMethods.all + Finance_V1_FinanceInternalMethods.all,
        rpcs: [
            ContractRPC(Finance_V1_FinanceMethods.createPayment, Finance_V1_CreatePaymentRequest.self, Finance_V1_CreatePaymentResponse.self),
            ContractRPC(Finance_V1_FinanceMethods.createCharge, Finance_V1_CreateChargeRequest.self, Finance_V1_CreateChargeResponse.self),
            ContractRPC(Finance_V1_FinanceMethods.getBalances, Finance_V1_GetBalancesRequest.self, Finance_V1_GetBalancesResponse.self),
            ContractRPC(
                Finance_V1_FinanceMethods.listTransactions, Finance_V1_ListTransactionsRequest.self, Finance_V1_ListTransactionsResponse.self),
            ContractRPC(Finance_V1_FinanceMethods.getSettleUpPlan, Finance_V1_GetSettleUpPlanRequest.self, Finance_V1_GetSettleUpPlanResponse.self),
            ContractRPC(Finance_V1_FinanceMethods.recordRepayment, Finance_V1_RecordRepaymentRequest.self, Finance_V1_RecordRepaymentResponse.self),
            ContractRPC(
                Finance_V1_FinanceInternalMethods.recordTaskSettlement, Finance_V1_RecordTaskSettlementRequest.self,
                Finance_V1_RecordTaskSettlementResponse.self),
            ContractRPC(Finance_V1_FinanceInternalMethods.eraseUser, Finance_V1_EraseUserRequest.self, Finance_V1_EraseUserResponse.self),
            ContractRPC(Finance_V1_FinanceInternalMethods.verifyLedger, Finance_V1_VerifyLedgerRequest.self, Finance_V1_VerifyLedgerResponse.self),
        ])
}
