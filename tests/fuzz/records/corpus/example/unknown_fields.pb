H¹`QZskipe
hH¹`QZskipe
OH¹`QZskipe
k3H¹`QZskipe
H¹`QZskipe
vH¹`QZskipe