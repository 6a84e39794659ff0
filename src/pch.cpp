// Carrier translation unit for the precompiled header.
int fsdp_pch_anchor = 0;
