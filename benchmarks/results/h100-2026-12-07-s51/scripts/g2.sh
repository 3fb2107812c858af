# session 51, call 2 (carry [".s28q", ".s51"]): megakernel variants after call 1 (the o_proj phase's merge of the
# attention chunks in one load: mg=4; L2 prefetch of 4 / 8 units a phase), then the engine's plain step on the same card
MV="rb=4,st=3 rb=4,st=3,mg=4 rb=4,st=3,mg=4,pf=4 rb=4,st=3,mg=4,pf=8 rb=4,st=4,mg=4" MT=300 bash .s51/g1.sh
