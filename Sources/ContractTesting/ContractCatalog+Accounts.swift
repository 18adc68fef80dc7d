import Contracts
import RPCCore

// Maintained by hand (the generator emits no message registry): every RPC of accounts.v1.Accounts and
// accounts.v1.AccountsInternal with its Swift request and response types. ContractTests checks that
// this table lists exactly the methods of Accounts_V1_AccountsMethods.all and
// Accounts_V1_AccountsInternalMethods.all and that each type's protoMessageName matches the
// descriptor, so a new RPC fails the tests until its line is added here.
extension ContractCatalog {
    static let accounts = ContractCatalog.Service(
        directory: "accounts",
        methods: Accounts_V1_AccountsMethods.all + Accounts_V1_AccountsInternalMethods.all,
        rpcs: [
            ContractRPC(Accounts_V1_AccountsMethods.signUp, Accounts_V1_SignUpRequest.self, Accounts_V1_SignUpResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.logIn, Accounts_V1_LogInRequest.self, Accounts_V1_LogInResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.refreshSession, Accounts_V1_RefreshSessionRequest.self, Accounts_V1_RefreshSessionResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.logOut, Accounts_V1_LogOutRequest.self, Accounts_V1_LogOutResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.createGuest, Accounts_V1_CreateGuestRequest.self, Accounts_V1_CreateGuestResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.upgradeGuest, Accounts_V1_UpgradeGuestRequest.self, Accounts_V1_UpgradeGuestResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.changePassword, Accounts_V1_ChangePasswordRequest.self, Accounts_V1_ChangePasswordResponse.self),
            ContractRPC(
                Accounts_V1_AccountsMethods.requestPasswordReset, Accounts_V1_RequestPasswordResetRequest.self,
                Accounts_V1_RequestPasswordResetResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.resetPassword, Accounts_V1_ResetPasswordRequest.self, Accounts_V1_ResetPasswordResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.getMyProfile, Accounts_V1_GetMyProfileRequest.self, Accounts_V1_GetMyProfileResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.getProfile, Accounts_V1_GetProfileRequest.self, Accounts_V1_GetProfileResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.updateProfile, Accounts_V1_UpdateProfileRequest.self, Accounts_V1_UpdateProfileResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.searchUsers, Accounts_V1_SearchUsersRequest.self, Accounts_V1_SearchUsersResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.uploadAvatar, Accounts_V1_UploadAvatarRequest.self, Accounts_V1_UploadAvatarResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.chooseAvatar, Accounts_V1_ChooseAvatarRequest.self, Accounts_V1_ChooseAvatarResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.getAvatar, Accounts_V1_GetAvatarRequest.self, Accounts_V1_GetAvatarResponse.self),
            ContractRPC(
                Accounts_V1_AccountsMethods.listBuiltinAvatars, Accounts_V1_ListBuiltinAvatarsRequest.self,
                Accounts_V1_ListBuiltinAvatarsResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.deleteAccount, Accounts_V1_DeleteAccountRequest.self, Accounts_V1_DeleteAccountResponse.self),
            ContractRPC(Accounts_V1_AccountsMethods.getSigningKeys, Accounts_V1_GetSigningKeysRequest.self, Accounts_V1_GetSigningKeysResponse.self),
            ContractRPC(
                Accounts_V1_AccountsInternalMethods.getUsersByIds, Accounts_V1_GetUsersByIdsRequest.self, Accounts_V1_GetUsersByIdsResponse.self),
            ContractRPC(
                Accounts_V1_AccountsInternalMethods.resolveUsernames, Accounts_V1_ResolveUsernamesRequest.self,
                Accounts_V1_ResolveUsernamesResponse.self),
            ContractRPC(
                Accounts_V1_AccountsInternalMethods.resolveEmails, Accounts_V1_ResolveEmailsRequest.self, Accounts_V1_ResolveEmailsResponse.self),
            ContractRPC(Accounts_V1_AccountsInternalMethods.sendMail, Accounts_V1_SendMailRequest.self, Accounts_V1_SendMailResponse.self),
            ContractRPC(
                Accounts_V1_AccountsInternalMethods.listSentMail, Accounts_V1_ListSentMailRequest.self, Accounts_V1_ListSentMailResponse.self),
            ContractRPC(
                Accounts_V1_AccountsInternalMethods.checkSessions, Accounts_V1_CheckSessionsRequest.self, Accounts_V1_CheckSessionsResponse.self),
        ])
}
